/*
 * mt_quiet - a worker that builds a heap of small blocks, frees it and
 * goes quiet: on "build" it allocates MIB MiB of NODE-byte blocks (a
 * linked list, each block touched) and answers "built"; on "drop" it
 * frees them all and answers "dropped"; then it waits for the next line
 * without allocating anything (static stdio buffers, mt_common.h). First
 * it flushes (registering with the server) and prints "ready pid=P".
 * usage: mt_quiet MIB [NODE]
 */
#include "mt_common.h"

struct node {
	struct node *next;
};

int main(int argc, char **argv)
{
	size_t mib = argc > 1 ? strtoul(argv[1], NULL, 10) : 300;
	size_t size = argc > 2 ? strtoul(argv[2], NULL, 10) : 40;
	if (size < sizeof(struct node))
		size = sizeof(struct node);
	size_t n = mib * MIB / size;
	struct node *head = NULL;
	mt_flush();
	mt_say("ready pid=%d", (int)getpid());
	const char *cmd;
	while ((cmd = mt_wait()) && strcmp(cmd, "exit") != 0) {
		if (strcmp(cmd, "build") == 0) {
			for (size_t i = 0; i < n; i++) {
				struct node *x = malloc(size);
				if (!x)
					return 1;
				memset(x, 0x5a, size);
				x->next = head;
				head = x;
			}
			mt_say("built");
		} else if (strcmp(cmd, "drop") == 0) {
			while (head) {
				struct node *next = head->next;
				free(head);
				head = next;
			}
			mt_say("dropped");
		}
	}
	return 0;
}
