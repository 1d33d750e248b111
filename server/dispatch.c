/*
 * dispatch.c - requests in, responses out; no sockets.
 *
 * mts_input() splits a connection's input into varint-delimited frames.
 * mts_dispatch() answers one frame with exactly one framed Response,
 * appended to an output buffer. Every request is answered synchronously,
 * in the order read, so pipelined requests are answered in request order
 * without any bookkeeping.
 *
 * The input is hostile. A length prefix over MTS_MAX_FRAME is refused
 * before anything is allocated for it. A frame of more fields than any
 * request holds is refused before it is decoded (fields_within()). A
 * frame protobuf-c cannot decode is
 * answered with id 0, since its id could not be read, and ends the
 * connection, as the protocol says. Everything else that goes wrong is an
 * error Response on a connection that stays open.
 *
 * Answers are built from the registry's figures of the latest tick.
 * Strings in them point into registry memory, which lives at least until
 * the response is packed, before we return.
 *
 * Admit, Release and SetLimit change the registry at once (admit.c,
 * limits.c). Their effects (states, events, the published snapshot)
 * happen before the answer is appended. A Watch marks the peer as a
 * subscriber, whose events conn.c pushes. It is answered with one Event:
 * the fleet's current state.
 */
#include "mts_dispatch.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "memtally.pb-c.h"
#include "mtframe.h"
#include "mts_admit.h"
#include "mts_auth.h"
#include "mts_defs.h"
#include "mts_figures.h"
#include "mts_kinds.h"
#include "mts_limits.h"
#include "mts_log.h"
#include "mts_node.h"
#include "mts_policy.h"
#include "mts_procfs.h"
#include "mts_registry.h"
#include "mts_vouch.h"
#include "mtshm.h"

int mts_buf_reserve(struct mts_buf *b, size_t more)
{
	if (b->cap - b->len >= more)
		return 0;
	size_t cap = b->cap ? b->cap : 4096;
	while (cap - b->len < more) {
		if (cap > SIZE_MAX / 2)
			return -ENOMEM;
		cap *= 2;
	}
	uint8_t *d = realloc(b->data, cap);
	if (!d)
		return -ENOMEM;
	b->data = d;
	b->cap = cap;
	return 0;
}

void mts_buf_free(struct mts_buf *b)
{
	free(b->data);
	memset(b, 0, sizeof(*b));
}

/* Append `resp` with its length prefix. */
static int append_response(struct mts_buf *out, Memtally__V1__Response *resp)
{
	size_t need = mtframe_packed_size(&resp->base);
	int err = mts_buf_reserve(out, need);
	if (err < 0)
		return err;
	size_t n = mtframe_pack(&resp->base, out->data + out->len,
	                        out->cap - out->len);
	if (n != need)
		return -ENOMEM; /* cannot happen: we reserved `need` */
	out->len += n;
	return 0;
}

static int append_error(struct mts_buf *out, uint64_t id,
                        Memtally__V1__ErrorCode code, const char *msg)
{
	Memtally__V1__Response resp = MEMTALLY__V1__RESPONSE__INIT;
	Memtally__V1__Error e = MEMTALLY__V1__ERROR__INIT;
	/* A message may quote a name, or a peer's bytes, cut short. */
	char text[1024];
	snprintf(text, sizeof(text), "%s", msg);
	mt_utf8_scrub(text);
	e.code = code;
	e.message = text;
	resp.id = id;
	resp.error = &e;
	return append_response(out, &resp);
}

/* A name field that is not a name: which one, and the rule. */
static int bad_name(struct mts_buf *out, uint64_t id, const char *field)
{
	char msg[128];
	snprintf(msg, sizeof(msg),
	         "%s: not a valid name (at most %u bytes of UTF-8, no "
	         "control or bidi characters)",
	         field, MTS_NAME_MAX);
	return append_error(
	    out, id, MEMTALLY__V1__ERROR_CODE__ERROR_INVALID_REQUEST, msg);
}

/* ---- Register ---------------------------------------------------------- */

static int do_register(struct mts_registry *reg, struct mts_peer *peer,
                       uint64_t id, const Memtally__V1__Register *r,
                       struct mts_buf *out)
{
	char msg[160];
	if (r->layout_major != 0 && r->layout_major != MTSHM_VERSION_MAJOR) {
		snprintf(msg, sizeof(msg),
		         "segment layout is %u.%u; client understands %u.x",
		         MTSHM_VERSION_MAJOR, MTSHM_VERSION_MINOR,
		         r->layout_major);
		return append_error(
		    out, id, MEMTALLY__V1__ERROR_CODE__ERROR_UNSUPPORTED, msg);
	}
	struct mts_reg_result res;
	int err =
	    r->if_registered
	        ? mts_register_if_known(reg, peer, r->group, r->task,
	                                r->image_id, &res)
	        : mts_register(reg, peer, r->group, r->task, r->image_id, &res);
	switch (err) {
	case 0:
		break;
	case -ENOENT:
		return append_error(
		    out, id, MEMTALLY__V1__ERROR_CODE__ERROR_NOT_REGISTERED,
		    "this process is not registered (asked with "
		    "if_registered): nothing created");
	case -EINVAL:
		snprintf(msg, sizeof(msg),
		         "group and task must be at most %u bytes of valid "
		         "UTF-8 without control or bidirectional formatting "
		         "characters",
		         MTS_NAME_MAX);
		return append_error(
		    out, id, MEMTALLY__V1__ERROR_CODE__ERROR_INVALID_REQUEST,
		    msg);
	case -EPERM:
		return append_error(
		    out, id,
		    MEMTALLY__V1__ERROR_CODE__ERROR_NO_PEER_CREDENTIALS,
		    "Register needs a local Unix-socket peer whose pid is "
		    "visible to the server (SO_PEERCRED)");
	case -ENOSPC:
		snprintf(msg, sizeof(msg),
		         "no slot for this worker (all %u in use, or its uid "
		         "holds max_slots_per_uid); it runs unregistered",
		         reg->slot_count);
		return append_error(
		    out, id, MEMTALLY__V1__ERROR_CODE__ERROR_NO_SLOTS, msg);
	case -ESRCH:
		return append_error(out, id,
		                    MEMTALLY__V1__ERROR_CODE__ERROR_NOT_FOUND,
		                    "the registering process has exited");
	case -ESTALE:
		return append_error(
		    out, id, MEMTALLY__V1__ERROR_CODE__ERROR_PERMISSION_DENIED,
		    "the connecting process's pid now names another process "
		    "(started after the connection, or of another user); "
		    "register from the process that connected");
	default:
		snprintf(msg, sizeof(msg), "registration failed: %s",
		         strerror(-err));
		return append_error(
		    out, id, MEMTALLY__V1__ERROR_CODE__ERROR_INTERNAL, msg);
	}

	Memtally__V1__Response resp = MEMTALLY__V1__RESPONSE__INIT;
	Memtally__V1__Registered ok = MEMTALLY__V1__REGISTERED__INIT;
	ok.segment = (char *)reg->label;
	ok.slot = res.slot;
	ok.slot_generation = res.slot_generation;
	ok.segment_generation = reg->layout.generation;
	/* The header and the uid's table travel with this answer. */
	peer->send_fds[0] = res.fds[0];
	peer->send_fds[1] = res.fds[1];
	peer->nsend_fds = 2;
	ok.threshold = reg->threshold;
	ok.group = (char *)res.group;
	resp.id = id;
	resp.body_case = MEMTALLY__V1__RESPONSE__BODY_REGISTERED;
	resp.registered = &ok;
	return append_response(out, &resp);
}

/* ---- GetUsage / ListProcesses ------------------------------------------ */

static Memtally__V1__State proto_state(uint32_t s)
{
	return (Memtally__V1__State)s; /* same values as enum mtshm_state */
}

/* limit x high watermark, where the state turns `high`. */
static uint64_t high_mark(uint64_t limit, uint32_t bp)
{
	return (uint64_t)((unsigned __int128)limit * bp / MTS_BP_ONE);
}

/* The lanes' flush count, read from the slot when asked (the tick keeps
 * its process line for what it compares). */
static uint64_t proc_flushes(const struct mts_registry *reg,
                             const struct mts_proc *p)
{
	struct mtshm_slot_id *s = reg->slot_at ? reg->slot_at[p->slot] : NULL;
	if (!s)
		return 0;
	uint64_t flushes;
	int absurd;
	mtshm_slot_sum(s, reg->layout.lane_count, &flushes, &absurd);
	return flushes;
}

/*
 * What a peer may see of other uids' processes ([server] show_others).
 * Task, group and comm are names a user chose (a task may say what the
 * job is about), and /proc/PID/environ keeps them from other users, so
 * by default another uid's process shows only its pid, uid and figures:
 * what /proc shows everyone, and what a user needs to see who holds the
 * memory. Admins (auth.c, or the tcp_token) see everything.
 */
enum sight { SEE_ALL, SEE_COUNTS, SEE_NOTHING };

struct viewer {
	const struct mts_peer *peer;
	bool admin;
	enum mts_show others;
};

static struct viewer viewer_of(const struct mts_registry *reg,
                               const struct mts_peer *peer, const char *token)
{
	struct viewer v = {.peer = peer, .others = reg->policy.show_others};
	/* Asking auth.c costs a getsockopt for admin_gid: only when the
	 * answer can matter. */
	v.admin = v.others != MTS_SHOW_ALL &&
	          mts_authorise(reg, peer, token) != MTS_AUTH_NONE;
	return v;
}

static enum sight sight_of(const struct viewer *v, uint32_t uid)
{
	if (v->others == MTS_SHOW_ALL || v->admin ||
	    (v->peer->has_cred && v->peer->uid == uid))
		return SEE_ALL;
	return v->others == MTS_SHOW_NONE ? SEE_NOTHING : SEE_COUNTS;
}

/* A masked process's names are empty: a registered process always has a
 * group, so an empty one tells a client the names were withheld. */
static void fill_process(const struct mts_registry *reg,
                         const struct mts_proc *p, enum sight sight,
                         Memtally__V1__ProcessInfo *pi)
{
	bool names = sight == SEE_ALL;
	memtally__v1__process_info__init(pi);
	pi->pid = p->pid;
	pi->group = names ? reg->groups[p->group].name : "";
	pi->bytes = p->bytes;
	pi->peak = p->peak;
	pi->uid = p->uid;
	pi->slot = p->slot;
	pi->threads = p->threads;
	pi->flushes = proc_flushes(reg, p);
	pi->mapped_bytes = p->mapped;
	pi->allocator_free_bytes = p->allocator_free;
	pi->unvouched_bytes = p->unvouched;
	pi->trust =
	    p->uid_left    ? MEMTALLY__V1__TRUST__TRUST_LEFT
	    : p->exposed   ? MEMTALLY__V1__TRUST__TRUST_IN_REACH
	    : p->slot_lost ? MEMTALLY__V1__TRUST__TRUST_SLOT_UNREADABLE
	    : !mts_uid_trusted(reg, p->uid) ? MEMTALLY__V1__TRUST__TRUST_UID
	    : p->image_stale ? MEMTALLY__V1__TRUST__TRUST_EXEC_UNREGISTERED
	    : p->untrusted   ? MEMTALLY__V1__TRUST__TRUST_UID
	                     : MEMTALLY__V1__TRUST__TRUST_FULL;
	pi->trust_uid = p->uid_left || p->exposed ? p->left_uid : 0;
	pi->descendant_bytes = p->untrusted ? p->vouch.family_held : 0;
	pi->task = names ? p->task : "";
	pi->start_time = p->start_time;
	pi->comm = names ? (char *)p->comm : "";
	pi->corrupt = p->corrupt;
	pi->error_bytes = p->error_bytes;
	pi->registered_ns = p->registered_ns;
	pi->rss_bytes = p->rss;
	pi->limit = p->limit;
	pi->state = proto_state(p->state);
	pi->over_limit = p->state == MTSHM_STATE_OVER;
	pi->growth_bytes_per_s = mts_proc_growth(reg, p);
	pi->seconds_to_limit = mts_proc_forecast(reg, p);
}

/*
 * The shared figures (mts_figures.h) into `msg`, a Usage or a GroupUsage
 * (`group`), at the field numbers the table gives: the members are found
 * through the message's descriptor, so a figure reaches the protocol by
 * its row alone.
 */
static void put_figures(ProtobufCMessage *msg, const struct mts_figures *v,
                        bool group)
{
	for (size_t k = 0; k < mts_figure_count; k++) {
		const struct mts_figure *f = &mts_figure_table[k];
		unsigned id = group ? f->group_field : f->usage_field;
		if (!(f->out & MTS_FIG_PROTO) || !id)
			continue;
		const ProtobufCFieldDescriptor *fd =
		    protobuf_c_message_descriptor_get_field(msg->descriptor,
		                                            id);
		if (!fd)
			continue; /* the table's test says this cannot be */
		void *m = (char *)msg + fd->offset;
		switch (fd->type) {
		case PROTOBUF_C_TYPE_UINT64:
			*(uint64_t *)m = mts_figure_u64(v, f);
			break;
		case PROTOBUF_C_TYPE_UINT32:
			*(uint32_t *)m = (uint32_t)mts_figure_u64(v, f);
			break;
		case PROTOBUF_C_TYPE_ENUM:
			*(int *)m = (int)mts_figure_u64(v, f);
			break;
		case PROTOBUF_C_TYPE_DOUBLE:
			*(double *)m = mts_figure_f64(v, f);
			break;
		default:
			break;
		}
	}
}

static void fill_group(const struct mts_registry *reg,
                       const struct mts_group *g, const char *name,
                       Memtally__V1__GroupUsage *gu)
{
	memtally__v1__group_usage__init(gu);
	gu->name = (char *)name;
	if (!g)
		return; /* a group with no entry: all zero */
	put_figures(&gu->base, &g->fig, true);
	/* What follows from the figures and the policy. */
	gu->high_watermark_bytes =
	    high_mark(g->limit, g->high_bp ? g->high_bp : reg->policy.high_bp);
	gu->seconds_to_limit = mts_group_forecast(reg, g);
}

static int do_get_usage(struct mts_registry *reg, const struct viewer *v,
                        uint64_t id, const Memtally__V1__GetUsage *q,
                        struct mts_buf *out)
{
	const struct mts_totals *t = &reg->totals;
	Memtally__V1__Response resp = MEMTALLY__V1__RESPONSE__INIT;
	Memtally__V1__Usage u = MEMTALLY__V1__USAGE__INIT;
	Memtally__V1__GroupUsage gu;
	Memtally__V1__ProcessInfo pi;
	Memtally__V1__GroupUsage *gus = NULL, **gptrs = NULL;
	int err;

	put_figures(&u.base, &t->fig, false);
	/* The fleet's own, and what follows from its figures and the
	 * policy. */
	u.measure = (char *)mts_measure_name(reg->policy.measure);
	u.process_limit = reg->policy.process_limit;
	u.high_watermark_bytes = high_mark(t->limit, reg->policy.high_bp);
	u.seconds_to_limit = mts_fleet_forecast(reg);
	u.growth_window_ms = (uint32_t)(mts_growth_window_ns(reg) / 1000000u);
	u.forecast_horizon_ms = reg->policy.forecast_horizon_ms;
	u.unregistered = t->unregistered;
	u.ticks = t->ticks;
	u.threshold = reg->threshold;
	u.slots = reg->slot_count;
	u.slots_free = reg->nfree;
	const char *source;
	const struct mts_node_fig *node = mts_guard_figure(reg, &source);
	if (node) {
		u.node_bytes = node->usage;
		u.node_line = node->line;
		u.node_limit = node->limit;
		u.node_source = (char *)source;
		u.node_edge = (char *)mts_node_edge_name(node);
	}

	switch (q ? q->scope_case : MEMTALLY__V1__GET_USAGE__SCOPE__NOT_SET) {
	case MEMTALLY__V1__GET_USAGE__SCOPE_GROUP: {
		const char *name = q->group[0] ? q->group : "default";
		/* Echoed in the answer: never bytes a decoder refuses. */
		if (!mt_name_ok(name))
			return bad_name(out, id, "group");
		fill_group(reg, mts_find_group(reg, name), name, &gu);
		u.group = &gu;
		break;
	}
	case MEMTALLY__V1__GET_USAGE__SCOPE_PID: {
		const struct mts_proc *p = mts_find_pid(reg, q->pid);
		/* Hidden is answered as not registered: the answer must
		 * not tell that another uid runs it. */
		enum sight sight = p ? sight_of(v, p->uid) : SEE_NOTHING;
		if (sight == SEE_NOTHING) {
			char msg[64];
			snprintf(msg, sizeof(msg), "pid %u is not registered",
			         q->pid);
			return append_error(
			    out, id, MEMTALLY__V1__ERROR_CODE__ERROR_NOT_FOUND,
			    msg);
		}
		fill_process(reg, p, sight, &pi);
		u.process = &pi;
		break;
	}
	default: {
		/* Fleet scope: every group. */
		uint32_t n = 0;
		for (uint32_t i = 0; i < reg->groups_used; i++)
			n += reg->groups[i].name != NULL;
		gus = calloc(n ? n : 1, sizeof(*gus));
		gptrs = calloc(n ? n : 1, sizeof(*gptrs));
		if (!gus || !gptrs) {
			err = -ENOMEM;
			goto out_free;
		}
		uint32_t k = 0;
		for (uint32_t i = 0; i < reg->groups_used; i++) {
			const struct mts_group *g = &reg->groups[i];
			if (!g->name)
				continue;
			fill_group(reg, g, g->name, &gus[k]);
			gptrs[k] = &gus[k];
			k++;
		}
		u.n_groups = k;
		u.groups = gptrs;
		break;
	}
	}
	resp.id = id;
	resp.body_case = MEMTALLY__V1__RESPONSE__BODY_USAGE;
	resp.usage = &u;
	err = append_response(out, &resp);
out_free:
	free(gus);
	free(gptrs);
	return err;
}

/* ---- the top consumers (ListProcesses, a denied Admit) ----------------- */

/* What processes are ranked by: the accounted bytes (the list), or the
 * figure the limits compare (a denial names who holds what it counted). */
enum rank { BY_BYTES, BY_MEASURED };

static uint64_t rank_of(const struct mts_registry *reg, enum rank by,
                        const struct mts_proc *p)
{
	return by == BY_MEASURED ? mts_measured(reg, p->bytes, p->rss)
	                         : p->bytes;
}

/* `a` ranks below `b`: smaller, or as large and a higher pid (so that the
 * order is the same for the same figures). */
static bool ranks_below(const struct mts_registry *reg, enum rank by,
                        const struct mts_proc *a, const struct mts_proc *b)
{
	uint64_t x = rank_of(reg, by, a), y = rank_of(reg, by, b);
	return x != y ? x < y : a->pid > b->pid;
}

static void swap_procs(const struct mts_proc **h, size_t i, size_t j)
{
	const struct mts_proc *t = h[i];
	h[i] = h[j];
	h[j] = t;
}

/* The heap of top_procs(): h[0] ranks below every other entry. */
static void sift_up(const struct mts_registry *reg, enum rank by,
                    const struct mts_proc **h, size_t i)
{
	while (i > 0 && ranks_below(reg, by, h[i], h[(i - 1) / 2])) {
		swap_procs(h, i, (i - 1) / 2);
		i = (i - 1) / 2;
	}
}

static void sift_down(const struct mts_registry *reg, enum rank by,
                      const struct mts_proc **h, size_t n, size_t i)
{
	for (;;) {
		size_t l = 2 * i + 1, m = i;
		if (l < n && ranks_below(reg, by, h[l], h[m]))
			m = l;
		if (l + 1 < n && ranks_below(reg, by, h[l + 1], h[m]))
			m = l + 1;
		if (m == i)
			return;
		swap_procs(h, i, m);
		i = m;
	}
}

/*
 * The processes `v` may see, largest by `by` first, at most `max` of them
 * into out[] (room for `max`); with `group`, only those of that group
 * whose group `v` may see (a filter on a withheld group would tell its
 * membership). Returns how many. A heap of the `max` largest so far, then
 * sorted: one pass for a denial's few, a heap sort for a whole list.
 */
static size_t top_procs(const struct mts_registry *reg, const struct viewer *v,
                        const char *group, enum rank by, size_t max,
                        const struct mts_proc **out)
{
	size_t n = 0;
	for (uint32_t i = 0; i < reg->ndense; i++) {
		const struct mts_proc *p = reg->by_slot[reg->dense[i]];
		enum sight sight = sight_of(v, p->uid);
		if (sight == SEE_NOTHING ||
		    (group && (sight != SEE_ALL ||
		               strcmp(reg->groups[p->group].name, group) != 0)))
			continue;
		if (n < max) {
			out[n] = p;
			sift_up(reg, by, out, n++);
		} else if (max && ranks_below(reg, by, out[0], p)) {
			out[0] = p;
			sift_down(reg, by, out, n, 0);
		}
	}
	/* The lowest ranked goes last, one at a time. */
	for (size_t k = n; k > 1; k--) {
		swap_procs(out, 0, k - 1);
		sift_down(reg, by, out, k - 1, 0);
	}
	return n;
}

static int do_list(struct mts_registry *reg, const struct viewer *v,
                   uint64_t id, const Memtally__V1__ListProcesses *q,
                   struct mts_buf *out)
{
	const char *filter = q && q->group && q->group[0] ? q->group : NULL;
	/* A filter no group can bear would answer an empty list. */
	if (filter && !mt_name_ok(filter))
		return bad_name(out, id, "group");
	size_t cap = reg->ndense ? reg->ndense : 1;
	const struct mts_proc **procs = calloc(cap, sizeof(*procs));
	Memtally__V1__ProcessInfo *infos = calloc(cap, sizeof(*infos));
	Memtally__V1__ProcessInfo **ptrs = calloc(cap, sizeof(*ptrs));
	int err = -ENOMEM;
	if (!procs || !infos || !ptrs)
		goto out_free;

	size_t n = top_procs(reg, v, filter, BY_BYTES, cap, procs);
	for (size_t i = 0; i < n; i++) {
		fill_process(reg, procs[i], sight_of(v, procs[i]->uid),
		             &infos[i]);
		ptrs[i] = &infos[i];
	}

	Memtally__V1__Response resp = MEMTALLY__V1__RESPONSE__INIT;
	Memtally__V1__ProcessList pl = MEMTALLY__V1__PROCESS_LIST__INIT;
	pl.n_processes = n;
	pl.processes = ptrs;
	resp.id = id;
	resp.body_case = MEMTALLY__V1__RESPONSE__BODY_PROCESS_LIST;
	resp.process_list = &pl;
	err = append_response(out, &resp);
out_free:
	free(procs);
	free(infos);
	free(ptrs);
	return err;
}

/* ---- Admit / Release ---------------------------------------------------- */

#define TOP_N 5

/*
 * Has the peer on this Unix socket closed it (not only shut its writing
 * down)? Then nobody will read the answer: an Admit it sent and gave up
 * on (its timeout past while memtallyd was stopped or slow; `memtally
 * run` then runs its command unadmitted) would be granted a reservation
 * nobody releases until its TTL. Over TCP a closed peer shows only as
 * the end of its input, which a peer that merely shut its writing down
 * shows too: not looked at.
 */
static bool peer_hung_up(const struct mts_peer *peer)
{
	if (peer->tcp || peer->fd < 0)
		return false;
	struct pollfd p = {.fd = peer->fd, .events = POLLIN};
	return poll(&p, 1, 0) == 1 && (p.revents & POLLHUP);
}

static int do_admit(struct mts_registry *reg, const struct mts_peer *peer,
                    const struct viewer *v, uint64_t id,
                    const Memtally__V1__Admit *q, struct mts_buf *out)
{
	struct mts_admit_req ar = {
	    .bytes = q->bytes,
	    .group = q->group,
	    .task = q->task,
	    .ttl_s = q->ttl_seconds,
	    .kind = q->kind,
	    .in_process = q->in_process,
	    .thread = q->thread,
	    .host_limit = q->host_limit,
	    .again = q->again,
	    .until_release = q->until_release,
	};
	struct mts_admit_out res;
	char msg[160];
	if (peer_hung_up(peer)) {
		mts_log_uid(peer->uid, MTS_LOG_INFO,
		            "an Admit whose asker has closed its connection is "
		            "not decided (nobody would read the answer)",
		            "peer_pid=%u uid=%u bytes=%llu", peer->pid,
		            peer->uid, (unsigned long long)q->bytes);
		return append_error(
		    out, id, MEMTALLY__V1__ERROR_CODE__ERROR_INVALID_REQUEST,
		    "the connection was closed before the answer");
	}
	int err = mts_admit(reg, peer, &ar, &res);
	switch (err) {
	case 0:
		break;
	case -EINVAL:
		if (q->group && q->group[0] && !mt_name_ok(q->group))
			return bad_name(out, id, "group");
		if (q->task && !mt_name_ok(q->task))
			return bad_name(out, id, "task");
		if (q->kind && !mt_name_ok(q->kind))
			return bad_name(out, id, "kind");
		return append_error(
		    out, id, MEMTALLY__V1__ERROR_CODE__ERROR_INVALID_REQUEST,
		    "bytes must be above 0, or a kind given");
	default:
		snprintf(msg, sizeof(msg), "admission failed: %s",
		         strerror(-err));
		return append_error(
		    out, id, MEMTALLY__V1__ERROR_CODE__ERROR_INTERNAL, msg);
	}

	Memtally__V1__Response resp = MEMTALLY__V1__RESPONSE__INIT;
	Memtally__V1__AdmitResult ar_pb = MEMTALLY__V1__ADMIT_RESULT__INIT;
	Memtally__V1__ProcessInfo infos[TOP_N];
	Memtally__V1__ProcessInfo *ptrs[TOP_N];
	ar_pb.admitted = res.admitted;
	ar_pb.fleet_bytes = res.measured;
	ar_pb.reserved_bytes = res.reserved;
	ar_pb.requested_bytes = res.requested;
	ar_pb.limit = res.limit;
	ar_pb.measure = (char *)mts_measure_name(reg->policy.measure);
	ar_pb.growth_bytes_per_s = res.growth;
	ar_pb.seconds_to_limit = res.forecast_s;
	ar_pb.reserved_for_task = res.reserve;
	/* Both may quote a kind's name cut to their buffer. */
	mt_utf8_scrub(res.sized_by);
	mt_utf8_scrub(res.why);
	ar_pb.sized_by = res.sized_by;
	ar_pb.declared_bytes = res.declared;
	if (res.admitted) {
		ar_pb.reservation = res.id;
		ar_pb.ttl_seconds = res.ttl_s;
		ar_pb.in_process = res.hosted;
	} else {
		ar_pb.reason = res.why;
		ar_pb.limit_scope = res.scope;
		ar_pb.denied_by = (char *)mts_denial_name(res.reason);
		/* The top consumers now, by the measured figure. */
		const struct mts_proc *top[TOP_N];
		size_t n = top_procs(reg, v, NULL, BY_MEASURED, TOP_N, top);
		for (size_t i = 0; i < n; i++) {
			fill_process(reg, top[i], sight_of(v, top[i]->uid),
			             &infos[i]);
			ptrs[i] = &infos[i];
		}
		ar_pb.n_top = n;
		ar_pb.top = ptrs;
	}
	resp.id = id;
	resp.body_case = MEMTALLY__V1__RESPONSE__BODY_ADMIT_RESULT;
	resp.admit_result = &ar_pb;
	return append_response(out, &resp);
}

/* Release's and Reservation's answer for an id the server does not hold. */
static int not_held(struct mts_buf *out, uint64_t id, const char *resv)
{
	char msg[160];
	snprintf(msg, sizeof(msg),
	         "no outstanding reservation '%.*s' (released, expired or "
	         "never granted)",
	         (int)MTS_RESV_ID_LEN + 2, resv ? resv : "");
	return append_error(out, id, MEMTALLY__V1__ERROR_CODE__ERROR_NOT_FOUND,
	                    msg);
}

static int do_release(struct mts_registry *reg, const struct mts_peer *peer,
                      uint64_t id, const Memtally__V1__Release *q,
                      const char *token, struct mts_buf *out)
{
	uint64_t bytes = 0;
	int err = mts_release(reg, peer, q->reservation, token, &bytes);
	switch (err) {
	case 0:
		break;
	case -ENOENT:
		return not_held(out, id, q->reservation);
	case -EPERM:
		return append_error(
		    out, id, MEMTALLY__V1__ERROR_CODE__ERROR_PERMISSION_DENIED,
		    !peer->has_cred
		        ? "the reservation is not this connection's; "
		          "releasing it needs the server's tcp_token"
		        : "the reservation belongs to another user; "
		          "releasing it needs root, the server's uid, "
		          "the admin uid or gid, or the server's tcp_token");
	default:
		return append_error(out, id,
		                    MEMTALLY__V1__ERROR_CODE__ERROR_INTERNAL,
		                    strerror(-err));
	}
	Memtally__V1__Response resp = MEMTALLY__V1__RESPONSE__INIT;
	Memtally__V1__Released rel = MEMTALLY__V1__RELEASED__INIT;
	rel.reservation = q->reservation;
	rel.bytes = bytes;
	resp.id = id;
	resp.body_case = MEMTALLY__V1__RESPONSE__BODY_RELEASED;
	resp.released = &rel;
	return append_response(out, &resp);
}

/* A reservation, looked at (Reservation): who may, as for Release. */
static int do_reservation(struct mts_registry *reg, const struct mts_peer *peer,
                          uint64_t id, const Memtally__V1__Reservation *q,
                          const char *token, struct mts_buf *out)
{
	const struct mts_resv *r = q->reservation && q->reservation[0]
	                               ? mts_resv_find(reg, q->reservation)
	                               : NULL;
	if (r && mts_authorise_release(reg, peer, token, r->has_owner,
	                               r->uid) == MTS_AUTH_NONE)
		return append_error(
		    out, id, MEMTALLY__V1__ERROR_CODE__ERROR_PERMISSION_DENIED,
		    "the reservation belongs to another user; looking at it "
		    "needs what releasing it does");
	if (!r)
		return not_held(out, id, q->reservation);
	Memtally__V1__Response resp = MEMTALLY__V1__RESPONSE__INIT;
	Memtally__V1__ReservationInfo ri = MEMTALLY__V1__RESERVATION_INFO__INIT;
	ri.reservation = (char *)r->id;
	ri.bytes = r->bytes;
	ri.task = r->task ? r->task->name : "";
	ri.group = reg->groups[r->group].name;
	ri.taken_over = r->taken_over;
	resp.id = id;
	resp.body_case = MEMTALLY__V1__RESPONSE__BODY_RESERVATION_INFO;
	resp.reservation_info = &ri;
	return append_response(out, &resp);
}

/* ---- SetLimit ------------------------------------------------------------ */

static int do_set_limit(struct mts_registry *reg, const struct mts_peer *peer,
                        uint64_t id, const Memtally__V1__SetLimit *q,
                        const char *token, struct mts_buf *out)
{
	char msg[200], q1[MTS_LOGQ_MAX], who[MTS_PEER_WHO_MAX];
	enum mts_auth a = mts_authorise(reg, peer, token);
	if (a == MTS_AUTH_NONE) {
		reg->req->auth_denials++;
		mts_log_uid(mts_peer_log_uid(peer), MTS_LOG_WARN,
		            "SetLimit refused: not authorised", "%s token=%s",
		            mts_peer_who(peer, who, sizeof(who)),
		            token && token[0] ? "wrong" : "none");
		if (!peer->has_cred)
			snprintf(msg, sizeof(msg),
			         "SetLimit from a peer of unknown uid needs "
			         "the server's tcp_token in the request%s",
			         reg->policy.tcp_token
			             ? ""
			             : " (none is configured)");
		else
			snprintf(
			    msg, sizeof(msg),
			    "SetLimit needs root%s, the server's uid (%u), "
			    "the admin uid or gid, or the server's "
			    "tcp_token; uid %u is none of them%s",
			    reg->policy.root_admin ? ""
			                           : " (root_admin = false)",
			    reg->server_uid, peer->uid,
			    token && token[0] ? ", and the token sent is "
			                        "not the server's"
			                      : "");
		return append_error(
		    out, id, MEMTALLY__V1__ERROR_CODE__ERROR_PERMISSION_DENIED,
		    msg);
	}
	uint64_t prev = 0, now = 0;
	int err;
	switch (q->scope_case) {
	case MEMTALLY__V1__SET_LIMIT__SCOPE_GROUP:
		err = mts_limit_set_group(reg, q->group, q->bytes, &prev, &now);
		break;
	case MEMTALLY__V1__SET_LIMIT__SCOPE_PID:
		err = mts_limit_set_pid(reg, q->pid, q->bytes, &prev, &now);
		break;
	default: /* fleet, or no scope: the fleet */
		err = mts_limit_set_fleet(reg, q->bytes, &prev, &now);
		break;
	}
	switch (err) {
	case 0:
		break;
	case -ENOENT:
		snprintf(msg, sizeof(msg), "pid %u is not registered", q->pid);
		return append_error(
		    out, id, MEMTALLY__V1__ERROR_CODE__ERROR_NOT_FOUND, msg);
	case -EINVAL:
		return bad_name(out, id, "group");
	default:
		return append_error(out, id,
		                    MEMTALLY__V1__ERROR_CODE__ERROR_INTERNAL,
		                    strerror(-err));
	}
	char scope[MTS_NAME_MAX + 8];
	if (q->scope_case == MEMTALLY__V1__SET_LIMIT__SCOPE_GROUP)
		snprintf(scope, sizeof(scope), "group:%s",
		         q->group[0] ? q->group : "default");
	else if (q->scope_case == MEMTALLY__V1__SET_LIMIT__SCOPE_PID)
		snprintf(scope, sizeof(scope), "pid:%u", q->pid);
	else
		snprintf(scope, sizeof(scope), "fleet");
	mts_log_uid(mts_peer_log_uid(peer), MTS_LOG_INFO, "limit set",
	            "scope=%s limit=%llu previous=%llu by=%s %s",
	            mts_logq(q1, sizeof(q1), scope), (unsigned long long)now,
	            (unsigned long long)prev, mts_auth_name(a),
	            mts_peer_who(peer, who, sizeof(who)));
	Memtally__V1__Response resp = MEMTALLY__V1__RESPONSE__INIT;
	Memtally__V1__LimitSet ls = MEMTALLY__V1__LIMIT_SET__INIT;
	ls.bytes = now;
	ls.previous = prev;
	resp.id = id;
	resp.body_case = MEMTALLY__V1__RESPONSE__BODY_LIMIT_SET;
	resp.limit_set = &ls;
	return append_response(out, &resp);
}

/* ---- Watch --------------------------------------------------------------- */

/* After the fleet's: each group and process whose state, as its last event
 * told it, is not ok, as the peer may see it ("current state"). A
 * subscriber that reconnects (after a drop or a restart) would otherwise
 * never learn of a group that went over meanwhile; a scope not named is
 * ok. */
static int watch_catch_up(struct mts_registry *reg, struct mts_peer *peer,
                          uint64_t id, uint64_t now_ns, struct mts_buf *out)
{
	int err = 0;
	for (uint32_t i = 0; err == 0 && i < reg->groups_used; i++) {
		const struct mts_group *g = &reg->groups[i];
		if (!g->name || g->told.state == MTSHM_STATE_OK)
			continue;
		char scope[MTS_NAME_MAX + 8];
		snprintf(scope, sizeof(scope), "group:%s", g->name);
		struct mts_event ev = {
		    .scope = scope,
		    .state = g->told.state,
		    .previous = g->told.state,
		    .bytes = g->bytes,
		    .rss = g->rss,
		    .limit = g->limit,
		    .reserved = g->reserved,
		    .time_ns = now_ns,
		    .reason = "current state",
		    .growth = g->growth,
		    .forecast_s = mts_group_forecast(reg, g),
		};
		if (mts_event_visible(reg, peer, &ev))
			err = mts_event_append(reg, id, &ev, out);
	}
	for (uint32_t i = 0; err == 0 && i < reg->ndense; i++) {
		struct mts_proc *p = reg->by_slot[reg->dense[i]];
		if (p->told_state != MTSHM_STATE_OVER)
			continue;
		char scope[24];
		snprintf(scope, sizeof(scope), "pid:%u", p->pid);
		struct mts_event ev = {
		    .scope = scope,
		    .state = p->told_state,
		    .previous = p->told_state,
		    .bytes = p->bytes,
		    .rss = p->rss,
		    .limit = p->limit,
		    .time_ns = now_ns,
		    .reason = "current state",
		    .growth = mts_proc_growth(reg, p),
		    .has_uid = true,
		    .uid = p->uid,
		};
		if (mts_event_visible(reg, peer, &ev))
			err = mts_event_append(reg, id, &ev, out);
	}
	return err;
}

static int do_watch(struct mts_registry *reg, struct mts_peer *peer,
                    const char *token, bool own, uint64_t id,
                    struct mts_buf *out)
{
	const struct mts_totals *t = &reg->totals;
	Memtally__V1__Response resp = MEMTALLY__V1__RESPONSE__INIT;
	Memtally__V1__Event ev = MEMTALLY__V1__EVENT__INIT;
	/* Asked once: events are pushed without a request to ask with. */
	enum mts_auth auth = mts_authorise(reg, peer, token);
	bool admin = auth != MTS_AUTH_NONE;
	/* A subscriber never idles out: one uid may hold only a few
	 * subscriptions to everything it may see. One to its own tasks'
	 * events (Watch.own: each `memtally run` holds one) is bounded by
	 * its uid's connections instead, so that a job runner's many runs
	 * of one user each learn of their eviction. A second Watch on one
	 * connection is the same subscription, counted once it is not
	 * own. */
	uint32_t cap = reg->policy.watch_per_uid;
	unsigned key = mts_peer_log_uid(peer);
	if (!own && !peer->watch_counted && !admin && cap) {
		uint32_t held = mts_uid_count_get(&reg->watch_uids, key);
		if (held >= cap) {
			char msg[160];
			snprintf(msg, sizeof(msg),
			         "this uid holds %u Watch subscriptions, the "
			         "most one uid may ([server] "
			         "max_watch_per_uid = %u)",
			         held, cap);
			return append_error(
			    out, id,
			    MEMTALLY__V1__ERROR_CODE__ERROR_PERMISSION_DENIED,
			    msg);
		}
		/* Out of memory: not counted (nor capped). */
		peer->watch_counted =
		    mts_uid_count_add(&reg->watch_uids, key) == 0;
	}
	/* A second Watch on one connection moves the stream to its id. */
	peer->watching = true;
	peer->watch_id = id;
	peer->watch_admin = admin;
	peer->watch_by_token = auth == MTS_AUTH_TOKEN;
	peer->watch_own = own;
	/* The state the event stream last told: a change its budget holds
	 * back comes as an event. */
	ev.scope = "fleet";
	ev.state = proto_state(t->told.state);
	ev.previous = proto_state(t->told.state);
	ev.bytes = t->bytes;
	ev.rss_bytes = t->rss;
	ev.limit = t->limit;
	ev.reserved_bytes = t->reserved;
	ev.time_ns = mts_now_realtime();
	ev.measure = (char *)mts_measure_name(reg->policy.measure);
	ev.reason = "current state";
	ev.growth_bytes_per_s = t->growth;
	ev.seconds_to_limit = mts_fleet_forecast(reg);
	resp.id = id;
	resp.body_case = MEMTALLY__V1__RESPONSE__BODY_EVENT;
	resp.event = &ev;
	int err = append_response(out, &resp);
	if (err == 0)
		err = watch_catch_up(reg, peer, id, ev.time_ns, out);
	if (err == 0) {
		reg->req->events++;
		mts_log_uid(mts_peer_log_uid(peer), MTS_LOG_DEBUG,
		            "watch subscribed", "peer_pid=%u id=%llu",
		            peer->pid, (unsigned long long)id);
	}
	return err;
}

/* Do the workers `ev` names descend from the peer's process: are they
 * its own command's? */
static bool event_of_peers_command(const struct mts_peer *peer,
                                   const struct mts_event *ev)
{
	uint32_t pid = peer->pid;
	return ev->nancestors && bsearch(&pid, ev->ancestors, ev->nancestors,
	                                 sizeof(pid), mt_cmp_u32) != NULL;
}

bool mts_event_visible(const struct mts_registry *reg,
                       const struct mts_peer *peer, const struct mts_event *ev)
{
	/* Asked for its own only: its uid's events, not another's, admin or
	 * not. But the event of a task whose workers descend from the
	 * subscriber's process is its own too, whatever their uid (its
	 * command switched user: runuser, setpriv, gosu), where it may see
	 * that uid's at all. Another uid's workers that merely took the name
	 * are not its command. A TCP peer has no process to ask: a task it
	 * holds a reservation of (one made without an owner, for a peer of
	 * unknown uid) whose event's uid holds none is its own. */
	if (ev->has_uid && peer->watch_own) {
		if (peer->has_cred && peer->uid == ev->uid)
			return true;
		const char *task =
		    strncmp(ev->scope, "task:", 5) == 0 ? ev->scope + 5 : NULL;
		bool may = peer->watch_admin ||
		           reg->policy.show_others == MTS_SHOW_ALL;
		if (!task || !may)
			return false;
		if (peer->has_cred && !peer->tcp && peer->pid)
			return event_of_peers_command(peer, ev);
		return mts_task_owned_by(reg, task, peer->has_cred,
		                         peer->uid) &&
		       !mts_task_owned_by(reg, task, true, ev->uid);
	}
	/* Under counts a process's event shows what its ps line does: its
	 * pid and figures, no names. */
	if (!ev->has_uid || peer->watch_admin ||
	    (peer->has_cred && peer->uid == ev->uid))
		return true;
	/* A task's event names it: a name, which counts does not show. */
	if (strncmp(ev->scope, "task:", 5) == 0)
		return reg->policy.show_others == MTS_SHOW_ALL;
	return reg->policy.show_others != MTS_SHOW_NONE;
}

/* Pack the Response that carries `ev` on a Watch stream with id `id`.
 * Used by conn.c for pushed events. */
int mts_event_append(const struct mts_registry *reg, uint64_t id,
                     const struct mts_event *e, struct mts_buf *out)
{
	Memtally__V1__Response resp = MEMTALLY__V1__RESPONSE__INIT;
	Memtally__V1__Event ev = MEMTALLY__V1__EVENT__INIT;
	ev.scope = (char *)e->scope;
	ev.state = proto_state(e->state);
	ev.previous = proto_state(e->previous);
	ev.bytes = e->bytes;
	ev.rss_bytes = e->rss;
	ev.limit = e->limit;
	ev.reserved_bytes = e->reserved;
	ev.time_ns = e->time_ns;
	ev.measure = (char *)mts_measure_name(reg->policy.measure);
	ev.reason = (char *)(e->reason ? e->reason : "");
	ev.growth_bytes_per_s = e->growth;
	ev.seconds_to_limit = e->forecast_s;
	resp.id = id;
	resp.body_case = MEMTALLY__V1__RESPONSE__BODY_EVENT;
	resp.event = &ev;
	return append_response(out, &resp);
}

/* ---- entry points ------------------------------------------------------ */

/* ---- Kinds ------------------------------------------------------------- */

/* The most recent runs a KindInfo lists. */
#define KIND_LAST_N 8

static int do_kinds(struct mts_registry *reg, const struct viewer *v,
                    uint64_t id, const Memtally__V1__Kinds *q,
                    struct mts_buf *out)
{
	const char *only = q && q->kind && q->kind[0] ? q->kind : NULL;
	if (only && !mt_name_ok(only))
		return bad_name(out, id, "kind");
	struct mts_kind **list;
	int n = mts_kinds_list(reg, &list);
	if (n < 0)
		return n;
	size_t cap = n ? (size_t)n : 1;
	Memtally__V1__KindInfo *infos = calloc(cap, sizeof(*infos));
	Memtally__V1__KindInfo **ptrs = calloc(cap, sizeof(*ptrs));
	Memtally__V1__KindRun *runs = calloc(cap * KIND_LAST_N, sizeof(*runs));
	Memtally__V1__KindRun **rptrs =
	    calloc(cap * KIND_LAST_N, sizeof(*rptrs));
	char(*why)[64] = calloc(cap, sizeof(*why));
	int err = -ENOMEM;
	if (!infos || !ptrs || !runs || !rptrs || !why)
		goto out_free;
	const struct mts_policy *pol = &reg->policy;
	uint64_t now_s = mts_now_realtime() / 1000000000u;
	size_t m = 0;
	for (int i = 0; i < n; i++) {
		struct mts_kind *k = list[i];
		/* A kind name says what a user's job is, as a task name
		 * does: other uids' follow show_others. */
		enum sight sight = sight_of(v, k->uid);
		if (sight == SEE_NOTHING ||
		    (only && (sight != SEE_ALL || strcmp(k->name, only) != 0)))
			continue;
		Memtally__V1__KindInfo *ki = &infos[m];
		memtally__v1__kind_info__init(ki);
		ki->kind = sight == SEE_ALL ? k->name : (char *)"";
		ki->uid = k->uid;
		ki->runs_total = k->runs_total;
		ki->evictions = k->evictions;
		ki->outstanding = k->outstanding;
		uint64_t b;
		uint32_t r;
		if (mts_kind_estimate(reg, k, now_s, &b, &r) == 0) {
			ki->runs = r;
			ki->learned_bytes = b;
			mts_kind_method(pol, r, why[m], sizeof(why[m]));
			ki->learned_by = why[m];
			if (k->est_prof.known) {
				ki->length_ms = k->est_prof.mean_ms;
				ki->n_profile_bytes = MTS_KIND_STEPS;
				ki->profile_bytes = k->est_prof.bytes;
			}
		}
		size_t base = m * KIND_LAST_N, nl = 0;
		for (uint32_t j = 0; j < k->nruns && j < KIND_LAST_N; j++) {
			const struct mts_kind_run *kr =
			    &k->runs[(k->head + MTS_KIND_RUNS - 1 - j) %
			             MTS_KIND_RUNS];
			Memtally__V1__KindRun *pr = &runs[base + nl];
			memtally__v1__kind_run__init(pr);
			pr->peak_bytes = kr->peak;
			pr->end_time_ns = kr->end_s * 1000000000u;
			pr->evicted = kr->evicted != 0;
			rptrs[base + nl] = pr;
			nl++;
		}
		ki->n_last = nl;
		ki->last = nl ? &rptrs[base] : NULL;
		ptrs[m] = ki;
		m++;
	}
	Memtally__V1__Response resp = MEMTALLY__V1__RESPONSE__INIT;
	Memtally__V1__KindsResult kr = MEMTALLY__V1__KINDS_RESULT__INIT;
	kr.n_kinds = m;
	kr.kinds = ptrs;
	kr.quantile = pol->kind_quantile_bp / 100.0;
	kr.margin = pol->kind_margin_bp / 100.0;
	kr.window = pol->kind_window;
	kr.horizon_s = pol->kind_horizon_s;
	kr.default_size = mts_kind_default_size(reg);
	resp.id = id;
	resp.body_case = MEMTALLY__V1__RESPONSE__BODY_KINDS_RESULT;
	resp.kinds_result = &kr;
	err = append_response(out, &resp);
out_free:
	free(list);
	free(infos);
	free(ptrs);
	free(runs);
	free(rptrs);
	free(why);
	return err;
}

/* The token a request carries: its body's (Release, SetLimit, as older
 * clients send it) or else the envelope's. */
static const char *request_token(const Memtally__V1__Request *req)
{
	const char *t = NULL;
	if (req->body_case == MEMTALLY__V1__REQUEST__BODY_RELEASE)
		t = req->release->token;
	else if (req->body_case == MEMTALLY__V1__REQUEST__BODY_SET_LIMIT)
		t = req->set_limit->token;
	return t && t[0] ? t : req->token;
}

/*
 * A TCP peer whose uid the kernel did not give us (not on this host, or
 * no sock_diag) is nobody in particular: without the token it could
 * reserve memory and hold connections in no uid's name. So each of its
 * requests must carry the token. So must a Unix-socket peer without
 * credentials: one in a pid namespace memtallyd cannot see (a container
 * sharing the socket but not the host's pids), whose pid the kernel
 * gives as 0. Otherwise it would be the owner of every reservation made
 * without an owner, and could release other peers'. False (and an
 * error answer appended) when this one does not.
 */
static bool unidentified_refused(struct mts_registry *reg,
                                 struct mts_peer *peer,
                                 const Memtally__V1__Request *req,
                                 struct mts_buf *out, int *err)
{
	if (peer->has_cred ||
	    mts_token_equal(reg->policy.tcp_token, request_token(req)))
		return false;
	/* Its Register is refused for want of credentials, token or not:
	 * that answer says more. */
	if (!peer->tcp &&
	    req->body_case == MEMTALLY__V1__REQUEST__BODY_REGISTER)
		return false;
	reg->req->auth_denials++;
	char who[MTS_PEER_WHO_MAX];
	mts_log_uid(mts_peer_log_uid(peer), MTS_LOG_DEBUG,
	            "request refused: unknown uid and no token", "%s",
	            mts_peer_who(peer, who, sizeof(who)));
	char msg[240];
	const char *sent = request_token(req);
	snprintf(msg, sizeof(msg),
	         "a token is needed: this %s could not be tied to a local "
	         "uid, %s%s",
	         peer->tcp ? "TCP connection"
	                   : "peer (in a pid namespace memtallyd cannot see)",
	         reg->policy.tcp_token ? "so every request on it needs the "
	                                 "server's tcp_token"
	                               : "and the server has no tcp_token "
	                                 "configured",
	         sent && sent[0] ? "; the token this request carries is not "
	                           "it"
	                         : "");
	*err = append_error(out, req->id,
	                    MEMTALLY__V1__ERROR_CODE__ERROR_PERMISSION_DENIED,
	                    msg);
	/* Then closed: asking now and then without the token must not keep
	 * one of the places the token's holders share. */
	if (*err == 0) {
		*err = MTS_CLOSE;
		peer->token_refused = true;
	}
	return true;
}

/*
 * Are the fields of a Request's encoding, and of its body's, no more than
 * *left (counted down), each well formed? Checked before protobuf-c sees
 * the frame: it allocates every field it keeps, unknown ones too, and
 * parses repeated copies of a field one by one, so a 1 MiB frame of
 * 2-byte fields held the loop, which every peer shares, for ~150 ms. A
 * request has at most a dozen fields. Length-delimited payloads are
 * skipped in one step, so this costs the number of fields, not the bytes
 * (a string's payload is searched once for a 0 byte). Only the body (the
 * Request's message fields) is walked into: no body holds a message.
 */
struct walk {
	uint32_t left;         /* fields still allowed */
	const char *nul_field; /* a string field holding a 0 byte */
};

static bool fields_within(const uint8_t *p, size_t len,
                          const ProtobufCMessageDescriptor *d, bool top,
                          struct walk *w)
{
	size_t off = 0;
	while (off < len) {
		uint64_t key, v;
		int n =
		    mtframe_decode_len(p + off, len - off, UINT64_MAX, &key);
		if (n <= 0 || w->left == 0)
			return false;
		w->left--;
		off += (size_t)n;
		switch (key & 7) {
		case 0: /* varint */
			n = mtframe_decode_len(p + off, len - off, UINT64_MAX,
			                       &v);
			if (n <= 0)
				return false;
			off += (size_t)n;
			break;
		case 1: /* 64-bit */
			if (len - off < 8)
				return false;
			off += 8;
			break;
		case 5: /* 32-bit */
			if (len - off < 4)
				return false;
			off += 4;
			break;
		case 2: /* length-delimited */
			n = mtframe_decode_len(p + off, len - off, UINT64_MAX,
			                       &v);
			if (n <= 0 || v > len - off - (size_t)n)
				return false;
			off += (size_t)n;
			const ProtobufCFieldDescriptor *f =
			    key >> 3 <= UINT32_MAX
			        ? protobuf_c_message_descriptor_get_field(
			              d, (unsigned)(key >> 3))
			        : NULL;
			/* protobuf-c ends a string at its first 0 byte, so
			 * a name's checks would see only what comes before
			 * it: such a string is refused, not cut short. */
			if (f && f->type == PROTOBUF_C_TYPE_STRING &&
			    memchr(p + off, 0, (size_t)v) && !w->nul_field)
				w->nul_field = f->name;
			if (top && f && f->type == PROTOBUF_C_TYPE_MESSAGE &&
			    !fields_within(p + off, (size_t)v, f->descriptor,
			                   false, w))
				return false;
			off += (size_t)v;
			break;
		default: /* groups: never sent by a client of ours */
			return false;
		}
	}
	return true;
}

int mts_dispatch(struct mts_registry *reg, struct mts_peer *peer,
                 const uint8_t *body, size_t len, struct mts_buf *out)
{
	struct walk w = {.left = MTS_REQUEST_FIELDS_MAX};
	if (!fields_within(body, len, &memtally__v1__request__descriptor, true,
	                   &w)) {
		reg->req->protocol_errors++;
		mts_log_uid(mts_peer_log_uid(peer), MTS_LOG_WARN,
		            "request malformed or of too many fields, closing",
		            "peer_pid=%u bytes=%zu max_fields=%u", peer->pid,
		            len, MTS_REQUEST_FIELDS_MAX);
		char msg[120];
		snprintf(msg, sizeof(msg),
		         "the request is not a well-formed memtally.v1.Request "
		         "of at most %u fields",
		         MTS_REQUEST_FIELDS_MAX);
		int err = append_error(
		    out, 0, MEMTALLY__V1__ERROR_CODE__ERROR_UNDECODABLE, msg);
		return err < 0 ? err : MTS_CLOSE;
	}
	Memtally__V1__Request *req =
	    memtally__v1__request__unpack(NULL, len, body);
	if (!req) {
		reg->req->protocol_errors++;
		mts_log_uid(mts_peer_log_uid(peer), MTS_LOG_WARN,
		            "undecodable request, closing",
		            "peer_pid=%u bytes=%zu", peer->pid, len);
		int err = append_error(
		    out, 0, MEMTALLY__V1__ERROR_CODE__ERROR_UNDECODABLE,
		    "the request is not a decodable memtally.v1.Request");
		return err < 0 ? err : MTS_CLOSE;
	}

	int err;
	uint64_t id = req->id;
	if (unidentified_refused(reg, peer, req, out, &err)) {
		memtally__v1__request__free_unpacked(req, NULL);
		return err;
	}
	if (w.nul_field) {
		char msg[96];
		snprintf(msg, sizeof(msg), "%s: a string holds a 0 byte",
		         w.nul_field);
		memtally__v1__request__free_unpacked(req, NULL);
		return append_error(
		    out, id, MEMTALLY__V1__ERROR_CODE__ERROR_INVALID_REQUEST,
		    msg);
	}
	const char *token = request_token(req);
	peer->token_ok = mts_token_equal(reg->policy.tcp_token, token);
	peer->token_seen |= peer->token_ok;
	struct viewer v = {.peer = peer, .others = MTS_SHOW_ALL};
	if (req->body_case == MEMTALLY__V1__REQUEST__BODY_GET_USAGE ||
	    req->body_case == MEMTALLY__V1__REQUEST__BODY_LIST_PROCESSES ||
	    req->body_case == MEMTALLY__V1__REQUEST__BODY_ADMIT ||
	    req->body_case == MEMTALLY__V1__REQUEST__BODY_KINDS)
		v = viewer_of(reg, peer, token);
	switch (req->body_case) {
	case MEMTALLY__V1__REQUEST__BODY_REGISTER:
		err = do_register(reg, peer, id, req->register_, out);
		break;
	case MEMTALLY__V1__REQUEST__BODY_GET_USAGE:
		err = do_get_usage(reg, &v, id, req->get_usage, out);
		break;
	case MEMTALLY__V1__REQUEST__BODY_LIST_PROCESSES:
		err = do_list(reg, &v, id, req->list_processes, out);
		break;
	case MEMTALLY__V1__REQUEST__BODY_ADMIT:
		err = do_admit(reg, peer, &v, id, req->admit, out);
		break;
	case MEMTALLY__V1__REQUEST__BODY_RELEASE:
		err = do_release(reg, peer, id, req->release, token, out);
		break;
	case MEMTALLY__V1__REQUEST__BODY_SET_LIMIT:
		err = do_set_limit(reg, peer, id, req->set_limit, token, out);
		break;
	case MEMTALLY__V1__REQUEST__BODY_WATCH:
		err = do_watch(reg, peer, token, req->watch && req->watch->own,
		               id, out);
		break;
	case MEMTALLY__V1__REQUEST__BODY_KINDS:
		err = do_kinds(reg, &v, id, req->kinds, out);
		break;
	case MEMTALLY__V1__REQUEST__BODY_RESERVATION:
		err =
		    do_reservation(reg, peer, id, req->reservation, token, out);
		break;
	default:
		/* An unknown field number is a body from a newer protocol;
		 * nothing at all is a malformed request. */
		if (req->base.n_unknown_fields > 0)
			err = append_error(
			    out, id,
			    MEMTALLY__V1__ERROR_CODE__ERROR_UNSUPPORTED,
			    "request body not known to this server");
		else
			err = append_error(
			    out, id,
			    MEMTALLY__V1__ERROR_CODE__ERROR_INVALID_REQUEST,
			    "request has no body");
		break;
	}
	peer->token_ok = false; /* this request's only */
	memtally__v1__request__free_unpacked(req, NULL);
	return err;
}

int mts_input(struct mts_registry *reg, struct mts_peer *peer,
              const uint8_t *in, size_t len, struct mts_buf *out,
              struct mts_budget budget, size_t *consumed)
{
	size_t pos = 0;
	unsigned frames = 0;
	int ret = 0;
	while (pos < len && !peer->gone) {
		if (out->len >= budget.out_bytes || frames >= budget.frames ||
		    (budget.until_ns && frames &&
		     mts_now_monotonic() >= budget.until_ns)) {
			ret = MTS_MORE;
			break;
		}
		uint64_t body_len;
		int n = mtframe_decode_len(in + pos, len - pos, MTS_MAX_FRAME,
		                           &body_len);
		if (n == 0)
			break; /* the prefix is not complete yet */
		if (n < 0) {
			bool big = n == MTFRAME_ETOOBIG;
			reg->req->protocol_errors++;
			char msg[96];
			snprintf(msg, sizeof(msg),
			         big ? "frame longer than %u bytes"
			             : "bad length prefix (varint over 10 "
			               "bytes; limit %u)",
			         (unsigned)MTS_MAX_FRAME);
			mts_log_uid(mts_peer_log_uid(peer), MTS_LOG_WARN,
			            big ? "frame too large, closing"
			                : "bad frame prefix, closing",
			            "peer_pid=%u", peer->pid);
			ret = append_error(
			    out, 0,
			    big ? MEMTALLY__V1__ERROR_CODE__ERROR_FRAME_TOO_LARGE
			        : MEMTALLY__V1__ERROR_CODE__ERROR_UNDECODABLE,
			    msg);
			if (ret == 0)
				ret = MTS_CLOSE;
			break;
		}
		if (len - pos - (size_t)n < body_len)
			break; /* the body is not complete yet */
		ret = mts_dispatch(reg, peer, in + pos + n, (size_t)body_len,
		                   out);
		pos += (size_t)n + (size_t)body_len;
		frames++;
		if (ret != 0)
			break;
	}
	*consumed = pos;
	if (budget.answered)
		*budget.answered = frames;
	return ret;
}
