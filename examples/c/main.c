/* An outside program built against the installed memtally: the inline API
 * (TLS hot path exported from libmemtally.so) and the query library. */
#include <memtally.h>
#include <memtally_query.h>
#include <stdio.h>

int main(void)
{
	memtally_account(100000);
	memtally_account(-1000);
	memtally_query *q = NULL;
	int r = memtally_query_open(&q, "/nonexistent/memtally.sock", 100);
	printf("bytes=%lld version=%s open=%d\n",
	       (long long)memtally_process_bytes(), memtally_version(), r);
	memtally_query_close(q);
	return memtally_process_bytes() == 99000 && r < 0 ? 0 : 1;
}
