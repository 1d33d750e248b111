/*
 * server.c - lifecycle of one memtallyd: listener, segment, registry, tick.
 *
 * Start order matters. The socket is bound before the segment is touched:
 * creating a segment replaces any object of that name, so a second server
 * started by mistake must fail on the socket (EADDRINUSE) before it can
 * destroy the segment a live server's workers are writing into. A live
 * server on another socket but the same segment is caught by its
 * heartbeat: a segment whose heartbeat is fresh and whose server pid is
 * alive is refused (-EBUSY).
 *
 * Stop closes every handle (listener, connections, tick timer, pidfd
 * polls) and leaves the segment, slots included, in /dev/shm for the next
 * server; uv_run() then returns, and mts_server_free() unmaps and removes
 * the socket file.
 *
 * Issue 3 adds: the policy (limits, admission, enforcement, auth) installed
 * into the registry before the first tick, the Watch broadcast as the
 * registry's event sink, an RSS sweep timer at policy.rss_interval_ms, and
 * the optional TCP listener, opened last (after the segment) so a TCP
 * client never reaches a server without one.
 */
#include "server.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "log.h"
#include "metrics.h"

/* A heartbeat older than this is a dead server's: the longest tick
 * (MTS_TICK_MAX_MS) plus slack. */
#define HEARTBEAT_STALE_NS ((MTS_TICK_MAX_MS + 5000ull) * 1000000ull)

/* The /dev/shm path of a POSIX shm name ("/mt" -> "/dev/shm/mt"). */
static void segment_path(const char *name, char *buf, size_t cap)
{
	snprintf(buf, cap, "/dev/shm%s%s", name[0] == '/' ? "" : "/", name);
}

static bool same_file(const char *path, dev_t dev, ino_t ino)
{
	struct stat st;
	return stat(path, &st) == 0 && st.st_dev == dev && st.st_ino == ino;
}

static void remember_file(const char *path, dev_t *dev, ino_t *ino,
                          bool *known)
{
	struct stat st;
	*known = path && stat(path, &st) == 0;
	if (*known) {
		*dev = st.st_dev;
		*ino = st.st_ino;
	}
}

bool mts_socket_is_ours(const struct mts_server *srv)
{
	if (!srv->cfg.socket_path)
		return false;
	return !srv->sock_known ||
	       same_file(srv->cfg.socket_path, srv->sock_dev, srv->sock_ino);
}

/*
 * Notice, about once a second, when the socket file or the segment's
 * /dev/shm entry has been removed (or replaced) under us. Neither can be
 * put back from here without taking the running workers' counts with it,
 * so say once, at error level, what it means and what the operator must
 * do; say again if it comes back.
 */
static void check_files(struct mts_server *srv)
{
	char q[MTS_LOGQ_MAX], path[PATH_MAX];
	uint64_t now = uv_now(srv->loop);
	if (now - srv->files_checked_ms < 1000)
		return;
	srv->files_checked_ms = now;
	if (srv->sock_known) {
		bool ok = same_file(srv->cfg.socket_path, srv->sock_dev,
		                    srv->sock_ino);
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
	if (srv->seg_known) {
		segment_path(srv->cfg.segment, path, sizeof(path));
		bool ok = same_file(path, srv->seg_dev, srv->seg_ino);
		if (!ok && !srv->seg_gone)
			mts_log(MTS_LOG_ERROR,
			        "segment removed from /dev/shm or replaced: "
			        "new workers cannot attach and run uncounted "
			        "(running workers are still counted); restart "
			        "memtallyd to recreate it",
			        "path=%s", mts_logq(q, sizeof(q), path));
		else if (ok && srv->seg_gone)
			mts_log(MTS_LOG_INFO, "segment back", "path=%s",
			        mts_logq(q, sizeof(q), path));
		srv->seg_gone = !ok;
	}
}

static void on_tick(uv_timer_t *t)
{
	struct mts_server *srv = t->data;
	mts_tick(&srv->reg);
	check_files(srv);
}

static void on_rss_timer(uv_timer_t *t)
{
	struct mts_server *srv = t->data;
	mts_rss_sweep_start(&srv->reg);
}

static void rss_timer_set(struct mts_server *srv, uint32_t ms)
{
	if (!srv->rss_timer_open || srv->rss_interval_ms == ms)
		return;
	srv->rss_interval_ms = ms;
	uv_timer_start(&srv->rss_timer, on_rss_timer, ms, ms);
}

int mts_server_apply_policy(struct mts_server *srv,
                            const struct mts_policy *pol)
{
	int err = mts_limits_apply_policy(&srv->reg, pol);
	if (err < 0)
		return err;
	rss_timer_set(srv, srv->reg.policy.rss_interval_ms);
	return 0;
}

/* Is another live server publishing into segment `name`? Returns its pid,
 * or 0. A segment we cannot open or do not recognise is not in use. All
 * three are needed: a recent heartbeat, a running (not zombie) pid, and
 * that pid being a memtallyd -- so a server killed with -9 never blocks
 * its successor, and a recycled pid alone proves nothing. */
static uint32_t segment_owner_alive(const char *name)
{
	struct mtshm_map m;
	if (mtshm_open(name, 0, &m) < 0)
		return 0;
	struct mtshm_fleet f;
	/* No snapshot after many tries: its writer died mid-publish. */
	int err = mtshm_fleet_read(m.hdr, &f);
	uint32_t pid = m.hdr->server_pid;
	mtshm_close(&m);
	if (err < 0)
		return 0;

	uint64_t now = mts_now_monotonic();
	if (pid == 0 || pid == (uint32_t)getpid() || f.heartbeat_ns == 0 ||
	    f.heartbeat_ns > now || now - f.heartbeat_ns > HEARTBEAT_STALE_NS)
		return 0;
	if (!mts_pid_running((pid_t)pid))
		return 0;
	char comm[64];
	mts_read_comm((pid_t)pid, comm, sizeof(comm));
	return strcmp(comm, "memtallyd") == 0 ? pid : 0;
}

int mts_server_init(struct mts_server *srv, uv_loop_t *loop,
                    const struct mts_config *cfg)
{
	char q[MTS_LOGQ_MAX];
	int err;
	memset(srv, 0, sizeof(*srv));
	srv->loop = loop;
	srv->cfg = *cfg;

	if (cfg->socket_path) {
		err = mts_listen(srv);
		if (err < 0) {
			mts_log(MTS_LOG_ERROR, "cannot listen on socket",
			        "path=%s err=%s",
			        mts_logq(q, sizeof(q), cfg->socket_path),
			        strerror(-err));
			goto fail_close_listener;
		}
	}

	uint32_t other = segment_owner_alive(cfg->segment);
	if (other) {
		mts_log(MTS_LOG_ERROR,
		        "segment in use by a live memtallyd, refusing to "
		        "replace it",
		        "segment=%s server_pid=%u",
		        mts_logq(q, sizeof(q), cfg->segment), other);
		err = -EBUSY;
		goto fail_close_listener;
	}
	bool adopted;
	err = mts_segment_setup(cfg, &srv->map, &adopted);
	if (err < 0) {
		mts_log(
		    MTS_LOG_ERROR, "cannot create segment", "segment=%s err=%s",
		    mts_logq(q, sizeof(q), cfg->segment), mtshm_strerror(err));
		goto fail_close_listener;
	}
	mts_log(MTS_LOG_INFO, adopted ? "segment adopted" : "segment created",
	        "segment=%s bytes=%llu generation=%llu",
	        mts_logq(q, sizeof(q), cfg->segment),
	        (unsigned long long)srv->map.size,
	        (unsigned long long)srv->map.hdr->generation);
	err = mts_registry_init(&srv->reg, loop, &srv->map, cfg->segment);
	if (err < 0)
		goto fail_close_segment;
	srv->reg.on_event = mts_watch_broadcast;
	srv->reg.event_ctx = srv;
	struct mts_policy defaults;
	mts_policy_defaults(&defaults);
	err = mts_limits_apply_policy(&srv->reg,
	                              cfg->policy ? cfg->policy : &defaults);
	if (err < 0)
		goto fail_free_registry;
	if (adopted) {
		uint32_t kept, dropped;
		mts_adopt(&srv->reg, &kept, &dropped);
		mts_log(MTS_LOG_INFO, "restart: live workers adopted",
		        "kept=%u reclaimed=%u", kept, dropped);
		mts_tick(&srv->reg);
	}

	remember_file(srv->socket_bound ? cfg->socket_path : NULL,
	              &srv->sock_dev, &srv->sock_ino, &srv->sock_known);
	{
		char path[PATH_MAX];
		segment_path(cfg->segment, path, sizeof(path));
		remember_file(path, &srv->seg_dev, &srv->seg_ino,
		              &srv->seg_known);
	}
	srv->files_checked_ms = uv_now(loop);

	uv_timer_init(loop, &srv->tick);
	srv->tick.data = srv;
	uv_timer_start(&srv->tick, on_tick, cfg->tick_ms, cfg->tick_ms);
	uv_timer_init(loop, &srv->rss_timer);
	srv->rss_timer.data = srv;
	srv->rss_timer_open = true;
	rss_timer_set(srv, srv->reg.policy.rss_interval_ms);

	if (cfg->tcp_addr) {
		err = mts_listen_tcp(srv);
		if (err < 0) {
			mts_log(MTS_LOG_ERROR, "cannot listen on tcp",
			        "addr=%s err=%s",
			        mts_logq(q, sizeof(q), cfg->tcp_addr),
			        uv_strerror(err));
			/* Everything is open: stop closes it all. */
			mts_server_stop(srv);
			return err;
		}
	}
	if (cfg->metrics_addr) {
		/* Last, like TCP. It logs where it listens, or why not. */
		err = mts_metrics_start(&srv->metrics, cfg->metrics_addr,
		                        &srv->reg, loop);
		if (err < 0) {
			mts_server_stop(srv);
			return err;
		}
	}
	return 0;

fail_free_registry:
	mts_registry_free(&srv->reg);

fail_close_segment:
	mtshm_close(&srv->map);
fail_close_listener:
	/* The caller runs the loop to finish the close, then
	 * mts_server_free(). */
	srv->stopping = true;
	mts_conns_close(srv);
	return err;
}

void mts_server_stop(struct mts_server *srv)
{
	if (srv->stopping)
		return;
	srv->stopping = true;
	/* First: joins the HTTP thread, so nothing reads reg after this. */
	mts_metrics_stop(srv->metrics);
	srv->metrics = NULL;
	uv_close((uv_handle_t *)&srv->tick, NULL);
	if (srv->rss_timer_open) {
		uv_close((uv_handle_t *)&srv->rss_timer, NULL);
		srv->rss_timer_open = false;
	}
	mts_conns_close(srv);
	mts_registry_close(&srv->reg);
}

void mts_server_free(struct mts_server *srv)
{
	/* Only our own socket file: if it was removed and another server
	 * now listens at that path, leave its socket alone. */
	if (srv->socket_bound && mts_socket_is_ours(srv))
		unlink(srv->cfg.socket_path);
	srv->socket_bound = false;
	mts_registry_free(&srv->reg);
	mtshm_close(&srv->map);
}
