/*
 * mts_metrics.h - memtallyd's Prometheus endpoint (--metrics HOST:PORT).
 *
 * GET or HEAD /metrics answers with the text exposition format 0.0.4 of
 * the registry: fleet, group and process gauges, the counters of struct
 * mts_stats, the tick duration and build info. Every name starts with
 * `memtally_` and follows Prometheus' conventions (base units, `_total`
 * on counters, an enum as one gauge per state). metrics.c says how the
 * HTTP thread gets a snapshot of a registry that only the loop thread may
 * read, and how fresh that snapshot is.
 *
 * Private to server/, like server.h.
 */
#ifndef MEMTALLY_SERVER_METRICS_H
#define MEMTALLY_SERVER_METRICS_H

#include <stdint.h>
#include <sys/socket.h>

#include <uv.h>

#include "mts_conn.h"
#include "mts_registry.h"

#define MTS_METRICS_CONTENT_TYPE "text/plain; version=0.0.4; charset=utf-8"

/* A scrape is answered from a snapshot at most this old when it arrives;
 * an older one is re-rendered by the loop first. */
#define MTS_METRICS_FRESH_MS 100u
/* How long a scrape waits for the loop to render before it gets 503. */
#define MTS_METRICS_WAIT_MS 1000u

struct mts_metrics;
struct mts_reload_stats; /* mts_config.h */

/*
 * Append the exposition of `reg` to `out`, which the caller owns and
 * frees. Reads `reg` only; call it on the loop thread. Label values from
 * workers (group, comm) are escaped and made valid UTF-8. `cs` holds the
 * server's connection counters and `rs` its reloads; when NULL, those
 * families are left out. Returns 0 or -ENOMEM; on -ENOMEM `out` holds a
 * partial text to discard.
 */
int mts_metrics_render(const struct mts_registry *reg,
                       const struct mts_conn_stats *cs,
                       const struct mts_reload_stats *rs, struct mts_buf *out);

/*
 * Bind HOST:PORT and serve /metrics from an HTTP thread of its own. `reg`
 * and `cs` are kept, not copied, and read only on `loop`'s thread when the
 * loop runs after a scrape. So they need not be initialised yet, only
 * before the loop next runs; but the token a scrape must show is `reg`'s
 * policy's, read now (mts_metrics_set_token changes it). Logs
 * `msg="metrics listening"
 * addr=HOST:PORT` with the bound port, or the reason it cannot serve.
 * Call on the loop thread.
 *
 * Returns 0 and *out, or -EINVAL (a bad address), -errno from socket(),
 * bind() or listen() (-EADDRINUSE, -EACCES, -EADDRNOTAVAIL, ...), -ENOMEM,
 * or -EIO (the HTTP server did not start). On error nothing is left open
 * and *out is NULL.
 */
int mts_metrics_start(struct mts_metrics **out, const char *host_port,
                      const struct mts_registry *reg,
                      const struct mts_conn_stats *cs,
                      const struct mts_reload_stats *rs, uv_loop_t *loop);

/*
 * Stop serving: waits for a scrape in progress (at most
 * MTS_METRICS_WAIT_MS) and joins the HTTP thread, so the port is closed
 * and `reg` is no longer used when it returns. The memory is freed by a
 * close callback the next time the loop runs, as for any libuv handle.
 * Call on the loop thread. Accepts NULL.
 */
void mts_metrics_stop(struct mts_metrics *m);

/* The token a scrape must show (Authorization: Bearer), copied; NULL or
 * "" for none. The config refuses one longer than MTS_TOKEN_MAX;
 * given one, every request is refused. Call on the loop thread, at start and at
 * a reload. Accepts m == NULL. */
void mts_metrics_set_token(struct mts_metrics *m, const char *token);

/* The port bound (useful with port 0); 0 for NULL. */
uint16_t mts_metrics_port(const struct mts_metrics *m);

#endif /* MEMTALLY_SERVER_METRICS_H */
