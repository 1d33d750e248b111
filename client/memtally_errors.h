/*
 * memtally_errors.h - every error code libmemtally returns besides
 * -errno values, in one place. memtally_strerror() names each of them.
 *
 * They sit in a reserved range below -errno's; the shared-memory and frame
 * codes of the segment format (-3001.., -3101..) are named by
 * memtally_strerror() too.
 */
#ifndef MEMTALLY_ERRORS_H
#define MEMTALLY_ERRORS_H

/* The worker side. */
#define MEMTALLY_ENOTATTACHED (-4001) /* no server reached (yet) */
#define MEMTALLY_EDISABLED    (-4002) /* MEMTALLY_DISABLE=1 */
#define MEMTALLY_EPROTO       (-4003) /* the server answered nonsense */
#define MEMTALLY_ESERVER      (-4004) /* the server answered an error */
#define MEMTALLY_ENOHOOK      (-4010) /* jemalloc without the activity
                                       * callback (memtally_init) */

/* The server's error answers, beyond MEMTALLY_ESERVER (any other error
 * answer). memtally_query_last_error() holds the server's message. */
#define MEMTALLY_ENOTFOUND    (-4005) /* no such pid, group or reservation */
#define MEMTALLY_EPERM        (-4006) /* the request needs an authorised peer */
#define MEMTALLY_ENOSLOTS     (-4007) /* the server has no free slot */
#define MEMTALLY_EUNSUPPORTED (-4008) /* the server does not implement it */
#define MEMTALLY_EBADREQUEST  (-4009) /* the server rejected the request */

#endif /* MEMTALLY_ERRORS_H */
