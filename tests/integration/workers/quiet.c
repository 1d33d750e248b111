/*
 * quiet - a worker that builds a heap of small blocks, frees it and
 * goes quiet: on "build" it allocates MIB MiB of NODE-byte blocks (a
 * linked list, each block touched) and answers "built"; on "drop" it
 * frees them all and answers "dropped"; then it waits for the next line
 * without allocating anything (static stdio buffers, mt_worker.c). First
 * it flushes (registering with the server) and prints "ready pid=P".
 * usage: mt_worker quiet MIB [NODE]
 */
#include "mt_common.h"

struct node {
	struct node *next;
};

static struct node *head;
static size_t n, size;

static void cmd_build(const char *arg)
{
	(void)arg;
	for (size_t i = 0; i < n; i++) {
		struct node *x = malloc(size);
		if (!x)
			exit(1);
		memset(x, 0x5a, size);
		x->next = head;
		head = x;
	}
	mt_say("built");
}

static void cmd_drop(const char *arg)
{
	(void)arg;
	while (head) {
		struct node *next = head->next;
		free(head);
		head = next;
	}
	mt_say("dropped");
}

static int quiet_main(int argc, char **argv)
{
	size_t mib = argc > 1 ? strtoul(argv[1], NULL, 10) : 300;
	size = argc > 2 ? strtoul(argv[2], NULL, 10) : 40;
	if (size < sizeof(struct node))
		size = sizeof(struct node);
	n = mib * MIB / size;
	mt_flush();
	mt_ready();
	static const struct mt_cmd cmds[] = {
	    {"build", cmd_build}, {"drop", cmd_drop}, {NULL, NULL}};
	return mt_serve(cmds, 0);
}

const struct mt_sub mt_quiet = {"quiet", "MIB [NODE]", quiet_main};
