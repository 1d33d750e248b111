/*
 * server.c - lifecycle of one memtallyd: listener, restart record, shared
 * header, registry, and the timers of the tick, the RSS sweep and the
 * node guard. The tick itself is core.c's mts_core_tick().
 *
 * Start order matters. The socket is bound first, so a second server
 * started by mistake fails there (EADDRINUSE) before it touches anything.
 * Then the restart record (state.c) is opened and locked. Its lock
 * refuses (-EBUSY) a live server on another socket but the same record.
 * The record says whether there are workers to adopt, and with which
 * geometry. The header (a sealed memfd, mtshm.h) is created with that
 * geometry, and the registry adopts what the record lists. The policy
 * (limits, admission, enforcement, auth) is installed into the registry
 * before the first tick. The Watch broadcast is the registry's event
 * sink. The RSS sweep timer runs at policy.rss_interval_ms. The optional
 * TCP listener opens last, so a TCP client never reaches a half-started
 * server.
 *
 * Stop closes every handle (listener, connections, tick timer, pidfd
 * polls) and leaves the restart record for the next server. uv_run() then
 * returns. mts_server_free() unmaps, closes the record, which releases its
 * lock, and removes the socket file. The workers keep their slot tables
 * mapped, because that is what the next server adopts.
 */
#include "server.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "mts_adopt.h"
#include "mts_config.h"
#include "mts_conn.h"
#include "mts_core.h"
#include "mts_fault.h"
#include "mts_guard.h"
#include "mts_hooks.h"
#include "mts_kinds.h"
#include "mts_limits.h"
#include "mts_log.h"
#include "mts_metrics.h"
#include "mts_policy.h"
#include "mts_registry.h"
#include "mts_rss.h"
#include "mts_state.h"
#include "mtshm.h"

static bool same_file(const char *path, dev_t dev, ino_t ino)
{
	struct stat st;
	return stat(path, &st) == 0 && st.st_dev == dev && st.st_ino == ino;
}

bool mts_socket_is_ours(const struct mts_server *srv)
{
	if (!srv->cfg.socket_path)
		return false;
	return !srv->net.sock_known ||
	       same_file(srv->cfg.socket_path, srv->net.sock_dev,
	                 srv->net.sock_ino);
}

/*
 * Notice, about once a second, when the socket file has been removed or
 * replaced under us. It cannot be put back from here without a window in
 * which another server could take the path. So say once, at error level,
 * what it means and what the operator must do, and say again if it comes
 * back. The shared objects have no name anyone could remove.
 */
static void check_files(struct mts_server *srv)
{
	char q[MTS_LOGQ_MAX];
	uint64_t now = uv_now(srv->loop);
	if (now - srv->files_checked_ms < 1000)
		return;
	srv->files_checked_ms = now;
	if (srv->net.sock_known) {
		bool ok = same_file(srv->cfg.socket_path, srv->net.sock_dev,
		                    srv->net.sock_ino);
		if (!ok && !srv->sock_gone)
			mts_log(MTS_LOG_ERROR,
			        "socket file removed or replaced: new workers "
			        "and clients cannot connect (running workers "
			        "are still counted); restart memtallyd to "
			        "recreate it",
			        "path=%s",
			        mts_logq(q, sizeof(q), srv->cfg.socket_path));
		else if (ok && srv->sock_gone)
			mts_log(MTS_LOG_INFO, "socket file back", "path=%s",
			        mts_logq(q, sizeof(q), srv->cfg.socket_path));
		srv->sock_gone = !ok;
	}
}

/* A write of a record (struct mts_recfile) on the thread pool. */
struct mts_rec_write {
	uv_work_t req;
	struct mts_server *srv;
	struct mts_recfile *rf;
	unsigned char *d;
	size_t len;
	int err;
};

/* The record changed meanwhile, or was not written: take it again. */
static void rec_redo(struct mts_server *srv, struct mts_recfile *rf)
{
	if (rf == &srv->kinds && srv->reg.kinds)
		srv->reg.kinds->dirty = true;
	else if (rf == &srv->resv && srv->reg.adm)
		srv->reg.adm->resv_dirty = true;
}

/* The outcome of a write: logged once while it keeps failing, and the
 * record marked changed, so that it is tried again. */
static void rec_written(struct mts_server *srv, struct mts_recfile *rf, int err)
{
	char q[MTS_LOGQ_MAX];
	if (err < 0) {
		if (!rf->failed)
			mts_log(MTS_LOG_WARN,
			        "cannot write a record: a restart will start "
			        "without the latest",
			        "record=%s path=%s err=%s", rf->what,
			        mts_logq(q, sizeof(q), rf->path),
			        strerror(-err));
		rf->failed = true;
		rec_redo(srv, rf);
		return;
	}
	rf->failed = false;
}

static void rec_write_work(uv_work_t *req)
{
	struct mts_rec_write *w = req->data;
	/* mts_kinds_write: any record, to a temporary name then renamed. */
	w->err = mts_kinds_write(w->rf->path, w->d, w->len);
}

static void rec_write_done(uv_work_t *req, int status)
{
	struct mts_rec_write *w = req->data;
	struct mts_server *srv = w->srv;
	struct mts_recfile *rf = w->rf;
	rf->inflight = NULL;
	rec_written(srv, rf, status < 0 ? status : w->err);
	free(w->d);
	free(w);
	/* The record taken at stop waited for this one. */
	if (rf->final) {
		rec_written(
		    srv, rf,
		    mts_kinds_write(rf->path, rf->final, rf->final_len));
		free(rf->final);
		rf->final = NULL;
	}
}

/* Write the record `d` (ours from here): on the thread pool, or at stop
 * (`force`) here, after the write in flight if there is one. */
static void rec_put(struct mts_server *srv, struct mts_recfile *rf,
                    unsigned char *d, size_t len, bool force)
{
	rf->taken_ms = uv_now(srv->loop);
	if (force && rf->inflight) {
		free(rf->final);
		rf->final = d;
		rf->final_len = len;
		return;
	}
	struct mts_rec_write *w = force ? NULL : malloc(sizeof(*w));
	if (w) {
		*w = (struct mts_rec_write){
		    .srv = srv, .rf = rf, .d = d, .len = len};
		w->req.data = w;
		if (uv_queue_work(srv->loop, &w->req, rec_write_work,
		                  rec_write_done) == 0) {
			rf->inflight = w;
			return;
		}
		free(w);
	}
	/* At stop, or without a thread pool: here. */
	rec_written(srv, rf, mts_kinds_write(rf->path, d, len));
	free(d);
}

/* Write the learned sizes when they changed (and about every
 * MTS_KINDS_SAVE_MS, `force`: now, at stop), forgetting kinds whose runs
 * all aged out. */
static void save_kinds(struct mts_server *srv, bool force)
{
	struct mts_recfile *rf = &srv->kinds;
	uint64_t now = uv_now(srv->loop);
	if (!rf->path[0] || !srv->reg.kinds ||
	    (!force && now - rf->checked_ms < MTS_KINDS_SAVE_MS))
		return;
	rf->checked_ms = now;
	/* Kinds age out even while a write is stuck (a state directory on
	 * a stalled disk): a kind all of whose runs aged out must not hold
	 * its uid's cap until the disk answers. The write has its bytes. */
	mts_kinds_age(&srv->reg, mts_now_realtime() / 1000000000u);
	if (!srv->reg.kinds->dirty || (!force && rf->inflight))
		return;
	mts_kinds_keep_refused(&srv->reg, rf->path);
	unsigned char *d;
	size_t len;
	int err = mts_kinds_encode(&srv->reg, &d, &len);
	if (err < 0) {
		rec_written(srv, rf, err);
		return;
	}
	srv->reg.kinds->dirty = false;
	rec_put(srv, rf, d, len, force);
}

/* Write the reservations a moment after one came or went, every
 * MTS_RESV_REFRESH_MS while any is held (their runs' peaks), and at stop
 * (`force`). */
static void save_resv(struct mts_server *srv, bool force)
{
	struct mts_recfile *rf = &srv->resv;
	if (!rf->path[0] || !srv->reg.adm)
		return;
	uint64_t now = uv_now(srv->loop);
	/* Taking the record runs on the loop and grows with the
	 * reservations (a few hundred bytes each): never more than 1% of
	 * the loop's time, however many a scheduler holds. */
	uint64_t gap = rf->cost_ms * 100;
	bool due = srv->reg.adm->resv_dirty
	               ? now - rf->taken_ms >= MTS_RESV_SAVE_MS &&
	                     now - rf->taken_ms >= gap
	               : srv->reg.adm->nresv &&
	                     now - rf->taken_ms >= MTS_RESV_REFRESH_MS &&
	                     now - rf->taken_ms >= gap;
	if (!force && (!due || rf->inflight))
		return;
	if (force && !srv->reg.adm->resv_dirty && !srv->reg.adm->nresv &&
	    !rf->inflight)
		return; /* the record on disk says as much */
	unsigned char *d;
	size_t len;
	uint64_t t0 = uv_hrtime();
	int err = mts_resv_encode(&srv->reg, &d, &len);
	rf->cost_ms = (uv_hrtime() - t0) / 1000000u;
	if (err < 0) {
		rec_written(srv, rf, err);
		return;
	}
	srv->reg.adm->resv_dirty = false;
	rec_put(srv, rf, d, len, force);
}

static void on_tick(uv_timer_t *t)
{
	struct mts_server *srv = t->data;
	mts_core_tick(&srv->reg);
	uint64_t now = mts_now_monotonic();
	/* The kernel figures a sweep read; then those the tick found claims
	 * running ahead of. */
	mts_rss_poll(&srv->reg, now);
	mts_rss_sweep_vouch(&srv->reg, now);
	/* Held-back log lines are reported within a tick of their second. */
	mts_log_flush(false);
	check_files(srv);
	save_kinds(srv, false);
	save_resv(srv, false);
}

static void on_guard_timer(uv_timer_t *t)
{
	struct mts_server *srv = t->data;
	mts_guard_check(&srv->reg, mts_now_monotonic());
}

void mts_server_apply_guard(struct mts_server *srv,
                            const struct mts_node_src *src,
                            const struct mts_node_fig *fig)
{
	/* A reload: whatever it changes, a paused task goes on, and the
	 * next check decides afresh under the new settings. */
	mts_guard_release(&srv->reg, "the guard's settings were reloaded");
	mts_guard_apply(&srv->reg, src, fig);
}

static void on_rss_timer(uv_timer_t *t)
{
	struct mts_server *srv = t->data;
	mts_rss_poll(&srv->reg, mts_now_monotonic());
	mts_rss_sweep_start(&srv->reg);
}

static void rss_timer_set(struct mts_server *srv, uint32_t ms)
{
	if (!srv->rss_timer_open || srv->rss_interval_ms == ms)
		return;
	srv->rss_interval_ms = ms;
	uv_timer_start(&srv->rss_timer, on_rss_timer, ms, ms);
}

/* The registry's event sink: Watch subscribers, then the state hooks. */
static void on_event(void *ctx, const struct mts_event *ev)
{
	struct mts_server *srv = ctx;
	mts_watch_broadcast(&srv->net, ev);
	mts_hooks_event(srv->hooks, ev);
}

void mts_server_apply_hooks(struct mts_server *srv, struct mts_hook_conf *conf)
{
	if (srv->hooks)
		mts_hooks_configure(srv->hooks, conf);
	mts_hook_conf_free(conf);
}

int mts_server_apply_policy(struct mts_server *srv,
                            const struct mts_policy *pol)
{
	const struct mts_policy *now = &srv->reg.policy;
	bool token_changed =
	    !now->tcp_token != !pol->tcp_token ||
	    (now->tcp_token && strcmp(now->tcp_token, pol->tcp_token) != 0);
	int err = mts_limits_apply_policy(&srv->reg, pol);
	if (err < 0)
		return err;
	/* Rights revoked hold for open Watch streams too. */
	mts_conns_reauthorise(&srv->net, token_changed);
	rss_timer_set(srv, now->rss_interval_ms);
	/* A lowered max_ttl holds for the reservations held, as it would
	 * after a restart. */
	mts_resv_policy_changed(&srv->reg);
	/* The caps hold from now, not from the next start: a lowered cap, or
	 * the per-uid one for a uid no longer admin_uid (exempt until now, it
	 * may hold more unmarked kinds than the cap). Admit keeps the table
	 * within the caps otherwise, so a reload that changes neither finds
	 * nothing past them and drops nothing. */
	mts_kinds_trim(&srv->reg);
	mts_metrics_set_token(srv->metrics, now->metrics_token);
	return 0;
}

/* Where the restart record lives: the configured path, else next to the
 * socket (SOCKET.state), else nowhere. */
static const char *state_path(const struct mts_config *cfg, char *buf,
                              size_t cap)
{
	if (cfg->state_path)
		return cfg->state_path[0] ? cfg->state_path : NULL;
	if (!cfg->socket_path)
		return NULL;
	if ((size_t)snprintf(buf, cap, "%s.state", cfg->socket_path) >= cap)
		return NULL;
	return buf;
}

/* The restart record: open (or create) it and learn whether a previous
 * server's workers are to be adopted, and with which geometry. 0, or
 * -EBUSY (a live server holds it), or -errno. */
static int open_record(struct mts_server *srv, const struct mts_config *cfg,
                       const char *spath, struct mts_state_info *info,
                       bool *adopted)
{
	char q[MTS_LOGQ_MAX];
	*adopted = false;
	if (!spath)
		return 0;
	/* Opened as if to adopt even when told to reset: the record may
	 * name tasks the guard before held stopped, to resume first. */
	struct mts_state_info fresh = *info;
	int err = mts_state_open(spath, false, info, adopted, &srv->state);
	if (err == 0 && *adopted && cfg->reset) {
		mts_adopt_resume_held(srv->state, info->slots);
		*info = fresh;
		*adopted = false;
		err = mts_state_reset(srv->state, info);
		if (err < 0) {
			/* A full disk: as without the file. */
			mts_log(MTS_LOG_WARN,
			        "cannot write the state file: running without "
			        "a restart record",
			        "path=%s err=%s", mts_logq(q, sizeof(q), spath),
			        strerror(-err));
			mts_state_close(srv->state);
			srv->state = NULL;
			err = 0;
		}
	}
	if (err == -EBUSY)
		mts_log(MTS_LOG_ERROR,
		        "state file locked by a live memtallyd, refusing "
		        "to start beside it",
		        "state=%s", mts_logq(q, sizeof(q), spath));
	if (err < 0)
		return err;
	if (*adopted &&
	    (info->slots != cfg->slots || info->lanes != cfg->lanes))
		mts_log(MTS_LOG_WARN,
		        "adopting the previous server's geometry "
		        "(--reset to apply the configured one)",
		        "slots=%u lanes=%u configured_slots=%u "
		        "configured_lanes=%u",
		        info->slots, info->lanes, cfg->slots, cfg->lanes);
	return 0;
}

/* The reservations of the server before, before its workers are adopted
 * (`adopted`: they will be, and a taken-over reservation none of whose
 * workers came back ends at the first tick): schedulers hold their ids,
 * and tasks run on them. --reset starts without them, and removes the
 * record so that no later start takes them up. A record refused leaves
 * the server without them, said once. */
static void restore_resv(struct mts_server *srv, bool reset, bool adopted)
{
	struct mts_recfile *rf = &srv->resv;
	char q[MTS_LOGQ_MAX], qw[MTS_LOGQ_MAX];
	if (!rf->path[0])
		return;
	if (reset) {
		if (unlink(rf->path) < 0 && errno != ENOENT)
			mts_log(MTS_LOG_WARN,
			        "cannot remove the reservations' record at "
			        "--reset: the first save replaces it",
			        "path=%s err=%s",
			        mts_logq(q, sizeof(q), rf->path),
			        strerror(errno));
		/* And an empty record written in its place soon after: one
		 * left behind (the unlink failed) is then replaced too. */
		srv->reg.adm->resv_dirty = true;
		return;
	}
	unsigned char *d = NULL;
	size_t len = 0;
	const char *why;
	/* The most a server writes: every reservation with the longest
	 * names. */
	size_t max = 64 + (size_t)MTS_RESV_MAX * (1024 + 3 * MTS_NAME_MAX);
	int err = mts_record_read(rf->path, max, &d, &len, &why);
	if (err == -ENOENT)
		return;
	uint32_t kept = 0, dropped = 0;
	if (err == 0) {
		err = mts_resv_restore(&srv->reg, d, len, adopted, &kept,
		                       &dropped);
		why = err == -EINVAL ? "not a record of reservations, or "
		                       "damaged"
		                     : strerror(-err);
	}
	free(d);
	if (err < 0)
		mts_log(MTS_LOG_WARN,
		        "restart: reservations' record refused: those after "
		        "what was kept are forgotten",
		        "path=%s why=%s kept=%u",
		        mts_logq(q, sizeof(q), rf->path),
		        mts_logq(qw, sizeof(qw), why), kept);
	else
		mts_log(MTS_LOG_INFO, "restart: reservations restored",
		        "kept=%u dropped=%u", kept, dropped);
	/* The record again, without what was dropped. */
	srv->reg.adm->resv_dirty = true;
}

/* The registry on the new header: policy applied, a previous server's
 * live workers adopted (and ticked once, so the first answers count
 * them). */
static int start_registry(struct mts_server *srv, const struct mts_config *cfg,
                          const char *label, const struct mts_state_info *info,
                          bool adopted)
{
	int err =
	    mts_core_init(&srv->reg, srv->loop, &srv->map, label, srv->state);
	if (err < 0)
		return err;
	/* Before any table is mapped: a page of one that faults is then
	 * answered (fault.c), not the end of the server. */
	int ferr =
	    mts_fault_init(srv->reg.slot_count + MTS_TABLES_IDLE_MAX + 1);
	if (ferr < 0)
		mts_log(MTS_LOG_WARN,
		        "slot tables not guarded against faults: a worker "
		        "that punches a hole in its slot under strict "
		        "overcommit can stop the server",
		        "err=%s", strerror(-ferr));
	srv->reg.instance = info->instance;
	srv->reg.lim->on_event = on_event;
	srv->reg.lim->event_ctx = srv;
	struct mts_policy defaults;
	mts_policy_defaults(&defaults);
	err = mts_limits_apply_policy(&srv->reg,
	                              cfg->policy ? cfg->policy : &defaults);
	if (err < 0) {
		mts_core_free(&srv->reg);
		return err;
	}
	/* Learned sizes are the node's history of its kinds, not of its
	 * workers: they are kept across --reset too. */
	if (srv->kinds.path[0])
		mts_kinds_load(&srv->reg, srv->kinds.path);
	/* Before the workers: as each is adopted it finds its task's
	 * reservations, as a worker registering does. */
	restore_resv(srv, cfg->reset, adopted);
	if (adopted) {
		uint32_t kept, dropped;
		mts_adopt(&srv->reg, &kept, &dropped);
		mts_log(MTS_LOG_INFO, "restart: live workers adopted",
		        "kept=%u reclaimed=%u", kept, dropped);
		mts_core_tick(&srv->reg);
	}
	return 0;
}

/* The tick, the RSS sweep and the socket-file check. */
static void start_timers(struct mts_server *srv, const struct mts_config *cfg)
{
	/* The socket file's identity was taken at its making (mts_listen). */
	srv->files_checked_ms = uv_now(srv->loop);
	uv_timer_init(srv->loop, &srv->tick);
	srv->tick.data = srv;
	uv_timer_start(&srv->tick, on_tick, cfg->tick_ms, cfg->tick_ms);
	uv_timer_init(srv->loop, &srv->rss_timer);
	srv->rss_timer.data = srv;
	srv->rss_timer_open = true;
	rss_timer_set(srv, srv->reg.policy.rss_interval_ms);
	/* The node guard's reads: cheap, and idle while it is off. */
	uv_timer_init(srv->loop, &srv->guard_timer);
	srv->guard_timer.data = srv;
	uv_timer_start(&srv->guard_timer, on_guard_timer, MTS_GUARD_CHECK_MS,
	               MTS_GUARD_CHECK_MS);
	srv->guard_timer_open = true;
}

/* TCP and /metrics, once everything else runs: on failure the caller
 * stops the whole server. Each logs where it listens, or why not. */
static int start_late_listeners(struct mts_server *srv,
                                const struct mts_config *cfg)
{
	char q[MTS_LOGQ_MAX];
	if (cfg->tcp_addr) {
		int err = mts_listen_tcp(&srv->net);
		if (err < 0) {
			mts_log(MTS_LOG_ERROR, "cannot listen on tcp",
			        "addr=%s err=%s",
			        mts_logq(q, sizeof(q), cfg->tcp_addr),
			        uv_strerror(err));
			return err;
		}
	}
	if (cfg->metrics_addr)
		return mts_metrics_start(&srv->metrics, cfg->metrics_addr,
		                         &srv->reg, &srv->net.conn_stats,
		                         &srv->reload_stats, srv->loop);
	return 0;
}

int mts_server_init(struct mts_server *srv, uv_loop_t *loop,
                    const struct mts_config *cfg)
{
	char q[MTS_LOGQ_MAX];
	int err;
	memset(srv, 0, sizeof(*srv));
	srv->loop = loop;
	srv->cfg = *cfg;
	srv->net.loop = loop;
	srv->net.reg = &srv->reg;
	srv->net.cfg = &srv->cfg;

	/* The socket first: a second server fails here, before it touches
	 * the first one's restart record. */
	if (cfg->socket_path) {
		err = mts_listen(&srv->net);
		if (err < 0) {
			mts_log(MTS_LOG_ERROR, "cannot listen on socket",
			        "path=%s err=%s",
			        mts_logq(q, sizeof(q), cfg->socket_path),
			        strerror(-err));
			goto fail_close_listener;
		}
	}
	char pathbuf[PATH_MAX];
	const char *spath = state_path(cfg, pathbuf, sizeof(pathbuf));
	struct mts_state_info info = {
	    .slots = cfg->slots,
	    .lanes = cfg->lanes,
	    .threshold = cfg->threshold,
	};
	bool adopted;
	srv->kinds.what = "learned sizes";
	srv->resv.what = "reservations";
	if (spath &&
	    (size_t)snprintf(srv->kinds.path, sizeof(srv->kinds.path),
	                     "%s.kinds", spath) >= sizeof(srv->kinds.path))
		srv->kinds.path[0] = 0;
	if (spath &&
	    (size_t)snprintf(srv->resv.path, sizeof(srv->resv.path), "%s.resv",
	                     spath) >= sizeof(srv->resv.path))
		srv->resv.path[0] = 0;
	err = open_record(srv, cfg, spath, &info, &adopted);
	if (err < 0)
		goto fail_close_listener;
	const char *label = cfg->segment && cfg->segment[0]
	                        ? cfg->segment + (cfg->segment[0] == '/')
	                        : "memtally";
	struct mtshm_params params = {
	    .slots = info.slots,
	    .lanes = info.lanes,
	    .threshold = cfg->threshold,
	};
	err = mtshm_header_create(label, &params, &srv->map);
	if (err < 0) {
		mts_log(MTS_LOG_ERROR, "cannot create the shared header",
		        "err=%s", mtshm_strerror(err));
		goto fail_close_state;
	}
	mts_log(MTS_LOG_INFO, adopted ? "segment adopted" : "segment created",
	        "label=%s state=%s slots=%u lanes=%u generation=%llu",
	        mts_logq(q, sizeof(q), label), spath ? spath : "none",
	        info.slots, info.lanes,
	        (unsigned long long)srv->map.hdr->generation);
	/* Before the registry, whose policy may send the first events. */
	err = mts_hooks_new(&srv->hooks, loop, cfg->hooks, cfg->socket_path);
	if (err < 0)
		goto fail_close_segment;
	err = start_registry(srv, cfg, label, &info, adopted);
	if (err < 0)
		goto fail_stop_hooks;
	start_timers(srv, cfg);
	err = start_late_listeners(srv, cfg);
	if (err < 0) {
		/* Everything is open: stop closes it all. */
		mts_server_stop(srv);
		return err;
	}
	/* Started for good (the loop has not run: no tick came first): the
	 * fleet's state, for a consumer that missed a change meanwhile. */
	mts_hooks_start(srv->hooks, srv->reg.totals.state, &srv->reg.totals.fig,
	                mts_measure_name(srv->reg.policy.measure));
	return 0;

fail_stop_hooks:
	mts_hooks_stop(srv->hooks);
	srv->hooks = NULL;
fail_close_segment:
	mtshm_close(&srv->map);
fail_close_state:
	mts_state_close(srv->state);
	srv->state = NULL;
fail_close_listener:
	/* The caller runs the loop to finish the close, then
	 * mts_server_free(). */
	srv->stopping = true;
	mts_conns_close(&srv->net);
	return err;
}

void mts_server_stop(struct mts_server *srv)
{
	if (srv->stopping)
		return;
	srv->stopping = true;
	/* Before anything else: no worker stays stopped past us. */
	mts_guard_release(&srv->reg, "memtallyd is stopping");
	save_kinds(srv, true);
	save_resv(srv, true);
	/* First: joins the HTTP thread, so nothing reads reg after this. */
	mts_metrics_stop(srv->metrics);
	srv->metrics = NULL;
	uv_close((uv_handle_t *)&srv->tick, NULL);
	/* Running hooks are killed; their handles close with the rest. */
	mts_hooks_stop(srv->hooks);
	srv->hooks = NULL;
	if (srv->rss_timer_open) {
		uv_close((uv_handle_t *)&srv->rss_timer, NULL);
		srv->rss_timer_open = false;
	}
	if (srv->guard_timer_open) {
		uv_close((uv_handle_t *)&srv->guard_timer, NULL);
		srv->guard_timer_open = false;
	}
	mts_conns_close(&srv->net);
	mts_registry_close(&srv->reg);
}

void mts_server_free(struct mts_server *srv)
{
	/* Only our own socket file: if it was removed and another server
	 * now listens at that path, leave its socket alone. */
	if (srv->net.socket_bound && mts_socket_is_ours(srv))
		unlink(srv->cfg.socket_path);
	srv->net.socket_bound = false;
	mts_core_free(&srv->reg);
	free(srv->kinds.final);
	srv->kinds.final = NULL;
	free(srv->resv.final);
	srv->resv.final = NULL;
	mtshm_close(&srv->map);
	mts_state_close(srv->state);
	srv->state = NULL;
}
