/*
 * errors.c - memtally_strerror() and memtally_version(): shared by
 * libmemtally and the query-only libmemtally_query, which carries no
 * worker state.
 */
#include "memtally.h"
#include "mtframe.h"
#include "mtshm.h"

const char *memtally_version(void)
{
	return MEMTALLY_VERSION_STRING;
}

const char *memtally_strerror(int err)
{
	switch (err) {
	case MEMTALLY_ENOTATTACHED:
		return "not attached to a memtally server";
	case MEMTALLY_EDISABLED:
		return "memtally disabled (MEMTALLY_DISABLE=1)";
	case MEMTALLY_EPROTO:
		return "memtally protocol error";
	case MEMTALLY_ESERVER:
		return "memtally server returned an error";
	case MEMTALLY_ENOHOOK:
		return "this jemalloc has no activity callback (jemalloc 5.3 "
		       "has it)";
	case MEMTALLY_ENOTFOUND:
		return "not found";
	case MEMTALLY_EPERM:
		return "permission denied by the memtally server";
	case MEMTALLY_ENOSLOTS:
		return "no free slot on the memtally server";
	case MEMTALLY_EUNSUPPORTED:
		return "request not supported by this memtally server";
	case MEMTALLY_EBADREQUEST:
		return "request rejected as invalid by the memtally server";
	case MTFRAME_EVARINT:
		return "malformed frame length";
	case MTFRAME_ETOOBIG:
		return "frame too large";
	default:
		return mtshm_strerror(err);
	}
}
