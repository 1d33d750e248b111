/*
 * mts_dispatch.h - one request frame in, one response frame out; no
 * sockets, so tests and fuzz targets drive it with plain buffers
 * (dispatch.c).
 */
#ifndef MTS_DISPATCH_H
#define MTS_DISPATCH_H

#include <stddef.h>
#include <stdint.h>

#include "mtframe.h"
#include "mts_registry.h"

/* dispatch.c's own counters (reg->req), for /metrics. */
struct mts_dispatch_stats {
	uint64_t events;          /* a Watch's first event, in its answer; those
	                           * pushed later: mts_conn_stats.watch_events */
	uint64_t protocol_errors; /* error responses for bad frames */
	uint64_t auth_denials;    /* SetLimit refused (Release: admit.c) */
};

/* A growable byte buffer. */
struct mts_buf {
	uint8_t *data;
	size_t len;
	size_t cap;
};

int mts_buf_reserve(struct mts_buf *b, size_t more);
void mts_buf_free(struct mts_buf *b);

/* The largest request: one is a few hundred bytes (names are at most 255),
 * and what a connection may make the server buffer and walk is bounded
 * by this, not by the 1 MiB a client accepts in an answer. */
#define MTS_MAX_FRAME (64u * 1024u)
/* Fields a request may hold, its body's included (a request has at most a
 * dozen): more is refused before it is decoded, see mts_dispatch(). */
#define MTS_REQUEST_FIELDS_MAX 64

/* Returned (positive) by mts_dispatch/mts_input: the connection must be
 * closed once the response already appended has been written. */
#define MTS_CLOSE 1
/* Returned by mts_input: it stopped at a budget with input left over;
 * call again later (after the output drains, or on the next turn). */
#define MTS_MORE 2

/*
 * Answer one packed Request body: append one framed Response to `out`.
 * Returns 0, MTS_CLOSE (undecodable: error answer, then close) or -ENOMEM
 * (nothing appended; the caller should drop the connection). A Watch sets
 * peer->watching and peer->watch_id; the caller then pushes events.
 */
int mts_dispatch(struct mts_registry *reg, struct mts_peer *peer,
                 const uint8_t *body, size_t len, struct mts_buf *out);

/* Append Response{id, event = ev} (a pushed Watch event) to `out`.
 * 0 or -ENOMEM. */
int mts_event_append(const struct mts_registry *reg, uint64_t id,
                     const struct mts_event *ev, struct mts_buf *out);

/* May the Watch subscriber `peer` be sent `ev`? Not a process's event of
 * another uid under `[server] show_others = none`, unless it is an admin. */
bool mts_event_visible(const struct mts_registry *reg,
                       const struct mts_peer *peer, const struct mts_event *ev);

/* How much one mts_input() call may do. */
struct mts_budget {
	size_t out_bytes;   /* stop once out->len reaches this */
	unsigned frames;    /* stop after answering this many frames */
	unsigned *answered; /* if not NULL: set to the frames answered */
	uint64_t until_ns;  /* if not 0: stop once CLOCK_MONOTONIC passes it,
	                     * a frame answered at least */
};

/*
 * Split in[0..len) into frames and answer each in order, appending the
 * responses to `out`, until the input holds no complete frame or the
 * budget is spent. *consumed is how many input bytes were used. Returns 0
 * (no complete frame left), MTS_MORE (budget spent, input left), MTS_CLOSE
 * (a bad frame was answered; stop reading and close after the write) or
 * -ENOMEM.
 */
int mts_input(struct mts_registry *reg, struct mts_peer *peer,
              const uint8_t *in, size_t len, struct mts_buf *out,
              struct mts_budget budget, size_t *consumed);

#endif /* MTS_DISPATCH_H */
