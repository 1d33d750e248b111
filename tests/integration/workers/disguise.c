/*
 * disguise - a file that is not a memfd, at a path that reads like one.
 * "mt_worker disguise MIB UID GID DIR CMD [ARGS...]", run as root:
 * allocates MIB MiB to a file in DIR, bind-mounts it at
 * "/memfd:disguised" in the root of a mount namespace of its own (the
 * machine's own root reached through symlinks beside it), opens it, drops
 * to UID:GID and execs CMD with that descriptor open (and LD_PRELOAD set
 * to $MT_EXEC_PRELOAD). From outside the namespace the descriptor's link
 * reads "/memfd:disguised (deleted)", as an unmapped memfd's does.
 *
 * It is what any user can do in a user namespace of their own (unshare
 * -Urm); root does it here so that the test needs no such namespace.
 */
#include "mt_common.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <limits.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/syscall.h>

static int fail(const char *what)
{
	mt_say("error %s: %s", what, strerror(errno));
	return 1;
}

/* Every entry of the machine's root, as a symlink into old/ beside it. */
static int link_old_root(const char *root)
{
	DIR *d = opendir("/");
	if (!d)
		return -1;
	char path[PATH_MAX + 300], target[300];
	for (struct dirent *e; (e = readdir(d));) {
		if (e->d_name[0] == '.' || strcmp(e->d_name, "old") == 0)
			continue;
		snprintf(path, sizeof(path), "%s/%s", root, e->d_name);
		snprintf(target, sizeof(target), "old/%s", e->d_name);
		if (symlink(target, path) < 0 && errno != EEXIST) {
			closedir(d);
			return -1;
		}
	}
	closedir(d);
	return 0;
}

static int disguise_main(int argc, char **argv)
{
	if (argc < 6)
		return 2;
	off_t len = (off_t)strtoull(argv[1], NULL, 10) * MIB;
	uid_t uid = (uid_t)strtoul(argv[2], NULL, 10);
	gid_t gid = (gid_t)strtoul(argv[3], NULL, 10);
	const char *dir = argv[4];
	char big[PATH_MAX], root[PATH_MAX], at[PATH_MAX + 32];
	snprintf(big, sizeof(big), "%s/disguised-XXXXXX", dir);
	snprintf(root, sizeof(root), "%s/root", dir);
	snprintf(at, sizeof(at), "%s/memfd:disguised", root);

	int bfd = mkstemp(big);
	if (bfd < 0)
		return fail("mkstemp");
	/* Blocks really allocated: what a stat's block count says. */
	static char chunk[1 << 16];
	memset(chunk, 1, sizeof(chunk));
	if (posix_fallocate(bfd, 0, len) != 0)
		for (off_t off = 0; off < len; off += (off_t)sizeof(chunk))
			if (write(bfd, chunk, sizeof(chunk)) !=
			    (ssize_t)sizeof(chunk))
				return fail("write");
	close(bfd);

	if (unshare(CLONE_NEWNS) < 0)
		return fail("unshare");
	if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0)
		return fail("mount private");
	if (mkdir(root, 0755) < 0 ||
	    mount("none", root, "tmpfs", 0, "size=1m,mode=755") < 0)
		return fail("tmpfs");
	int pfd = open(at, O_CREAT | O_WRONLY | O_CLOEXEC, 0644);
	if (pfd < 0)
		return fail("placeholder");
	close(pfd);
	if (mount(big, at, NULL, MS_BIND, NULL) < 0)
		return fail("bind");
	unlink(big); /* nothing left behind: the mount holds it */
	char old[PATH_MAX + 8];
	snprintf(old, sizeof(old), "%s/old", root);
	if (mkdir(old, 0755) < 0 || link_old_root(root) < 0)
		return fail("old root");
	if (chdir(root) < 0 || syscall(SYS_pivot_root, ".", "old") < 0 ||
	    chdir("/") < 0)
		return fail("pivot_root");
	int fd = open("/memfd:disguised", O_RDONLY); /* kept across exec */
	if (fd < 0)
		return fail("open");
	if (setgroups(0, NULL) < 0 || setresgid(gid, gid, gid) < 0 ||
	    setresuid(uid, uid, uid) < 0)
		return fail("drop");
	const char *preload = getenv("MT_EXEC_PRELOAD");
	if (preload)
		setenv("LD_PRELOAD", preload, 1);
	execv(argv[5], argv + 5);
	return fail("exec");
}

const struct mt_sub mt_disguise = {"disguise", "MIB UID GID DIR CMD [ARGS...]",
                                   disguise_main};
