/*
 * mts_procfs.h - what memtallyd reads of another process in /proc: start
 * time, comm, whether it still runs (procfs.c).
 */
#ifndef MTS_PROCFS_H
#define MTS_PROCFS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* Start time (field 22 of /proc/PID/stat, clock ticks since boot) from the
 * text of a stat file. Parses after the last ')' because comm may hold
 * spaces and parentheses. Returns 0 or -EINVAL. */
int mts_parse_stat_starttime(const char *stat, uint64_t *out);

/* The command name (field 2 of /proc/PID/stat, between the first '(' and
 * the last ')', as /proc/PID/comm has it) into buf, NUL-terminated and cut
 * to cap - 1 bytes. Returns 0 or -EINVAL (buf then ""). */
int mts_parse_stat_comm(const char *stat, char *buf, size_t cap);

/* Field `field` (>= 3, numbered as proc(5) does) of a stat file's text,
 * a decimal number. 0 or -EINVAL. */
int mts_parse_stat_field(const char *stat, int field, uint64_t *out);

/* The start time and arg_start (field 48) of `pid`: arg_start is placed
 * anew by each exec, so a change says the process runs another image. It
 * reads 0 to a reader without ptrace access. 0 or -errno. */
int mts_read_exec_mark(pid_t pid, uint64_t *start_time, uint64_t *mark);

/* Read the start time of `pid`. Returns 0, -ENOENT/-ESRCH (gone), -EINVAL. */
int mts_read_starttime(pid_t pid, uint64_t *out);

/* The same, and its command name into comm (cap bytes; "" if unreadable),
 * from one read of /proc/PID/stat: a registration's one /proc file. */
int mts_read_stat(pid_t pid, uint64_t *start_time, char *comm, size_t cap);

/* The real uid of `pid` (first field of Uid: in /proc/PID/status).
 * Returns 0, -ENOENT/-ESRCH (gone), -EINVAL. */
int mts_read_real_uid(pid_t pid, uint32_t *out);
/* The real and effective uids of `pid` (effective may be NULL). 0 or
 * -errno. */
int mts_read_uids(pid_t pid, uint32_t *real, uint32_t *effective);
/* The first `n` uids of the Uid: line of a status file's text (real,
 * effective, saved, fs). 0 or -EINVAL. */
int mts_parse_uid_fields(const char *status, uint32_t *uids, unsigned n);

/* The state letter and parent pid of `pid` (fields 3 and 4 of
 * /proc/PID/stat). Returns 0, -ENOENT/-ESRCH (gone), -EINVAL. */
int mts_read_state_ppid(pid_t pid, char *state, uint32_t *ppid);

/* The parent pid and start time of `pid`, from one read of
 * /proc/PID/stat. Returns 0, -ENOENT/-ESRCH (gone), -EINVAL. */
int mts_read_parent(pid_t pid, uint32_t *ppid, uint64_t *start_time);

/* The most parents mts_add_ancestors() walks up from one process. */
#define MTS_ANCESTRY_MAX 64u

/* Add the parent of `pid`, its parent, and so on (at most
 * MTS_ANCESTRY_MAX; never init, everyone's) to set[0..*n), which holds at
 * most `cap`: up to the first one already there, whose own are there too.
 * Each parent read is confirmed by reading its child's parent again: a
 * parent that died in between had its children reparented first, so an
 * unchanged answer proves the read was of that parent, not of a pid reused
 * since. 0; -ESRCH where a process of the chain went (what was added
 * stands); -ENOSPC when the set is full. */
int mts_add_ancestors(uint32_t pid, uint32_t *set, uint32_t *n, uint32_t cap);

/* Parse the text of a statm file: resident pages x page_size, and
 * (`anon` not NULL) resident less shared pages x page_size. */
int mts_parse_statm_rss(const char *statm, uint64_t page_size, uint64_t *rss,
                        uint64_t *anon);

/* Read the small file DIR/NAME into buf (NUL-terminated, at most cap - 1
 * bytes). Its length, or -errno. */
ssize_t mts_read_small(const char *dir, const char *name, char *buf,
                       size_t cap);
/* The same for /proc/PID/NAME. */
ssize_t mts_read_proc_file(pid_t pid, const char *name, char *buf, size_t cap);

/* The lines of `fd` up to its end, each longer than MTS_PROC_LINE_MAX left
 * out, into buf (NUL-terminated; lines past cap - 1 left out too). For
 * /proc/PID/status, whose Groups: line alone can be hundreds of KiB
 * (setgroups, a directory service's groups) and comes before the memory
 * lines: read whole, cut at 4 KiB, the figures would be lost. Its length,
 * or -errno. */
#define MTS_PROC_LINE_MAX 256u
ssize_t mts_read_short_lines(int fd, char *buf, size_t cap);
/* /proc/PID/status through mts_read_short_lines. */
ssize_t mts_read_proc_status(pid_t pid, char *buf, size_t cap);

/* A main thread that exited (pthread_exit, a bare SYS_exit) leaves its
 * process a zombie leader: /proc/PID's own memory files show nothing
 * (smaps_rollup fails, status has no Rss lines) and its old credentials,
 * while the other threads hold and run it all. These read a thread's
 * view, /proc/PID/task/TID/NAME (its status through
 * mts_read_short_lines), which is the process's. mts_live_thread: a
 * thread of PID other than its leader, or -ESRCH. */
ssize_t mts_read_thread_file(pid_t pid, pid_t tid, const char *name, char *buf,
                             size_t cap);
ssize_t mts_read_thread_status(pid_t pid, pid_t tid, char *buf, size_t cap);
pid_t mts_live_thread(pid_t pid);

#endif /* MTS_PROCFS_H */
