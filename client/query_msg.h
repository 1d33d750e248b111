/*
 * query_msg.h - the query library's answers as they came off the wire,
 * for the `memtally` command only: it shows the fields it does not know
 * by their protobuf-c descriptors, so a field added to memtally.proto
 * reaches `memtally status` with no change to the command. Not part of the
 * libraries' ABI (their version scripts keep these names local).
 */
#ifndef MEMTALLY_QUERY_MSG_H
#define MEMTALLY_QUERY_MSG_H

#include "memtally.pb-c.h"
#include "memtally_query.h"

/* memtally_query_usage(), and with `msg` non-NULL the response it was
 * made from (its `usage`), which the caller frees with
 * memtally__v1__response__free_unpacked(); *msg is NULL on an error. */
int memtally_query_usage_msg(memtally_query *q, struct memtally_usage **out,
                             Memtally__V1__Response **msg);

#endif /* MEMTALLY_QUERY_MSG_H */
