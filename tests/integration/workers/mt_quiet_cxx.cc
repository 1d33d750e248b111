// mt_quiet_cxx - mt_quiet's protocol in C++: on "build" MIB MiB of small
// objects made with new (std::list nodes of a 24-byte payload), touched,
// answered "built"; on "drop" the list is cleared ("dropped"); then it
// waits for the next line without allocating (its stdio buffers are set
// before the first line). First "ready pid=P".
// usage: mt_quiet_cxx MIB
#include <array>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <list>

#include <dlfcn.h>
#include <unistd.h>

static char in_buf[4096], out_buf[4096];

static void say(const char *what)
{
	std::printf("%s\n", what);
	std::fflush(stdout);
}

int main(int argc, char **argv)
{
	std::setvbuf(stdin, in_buf, _IOFBF, sizeof(in_buf));
	std::setvbuf(stdout, out_buf, _IOFBF, sizeof(out_buf));
	size_t mib = argc > 1 ? std::strtoul(argv[1], nullptr, 10) : 300;
	// A node: two links and the payload, 40 bytes, a 48-byte block.
	size_t n = mib * 1048576 / 40;
	std::list<std::array<char, 24>> hold;
	auto flush = reinterpret_cast<int (*)()>(
		dlsym(RTLD_DEFAULT, "memtally_flush"));
	if (flush)
		flush();
	std::printf("ready pid=%d\n", (int)getpid());
	std::fflush(stdout);
	char line[256];
	while (std::fgets(line, sizeof(line), stdin)) {
		line[std::strcspn(line, "\n")] = 0;
		if (std::strcmp(line, "exit") == 0)
			break;
		if (std::strcmp(line, "build") == 0) {
			std::array<char, 24> v;
			v.fill('x');
			for (size_t i = 0; i < n; i++)
				hold.push_back(v);
			say("built");
		} else if (std::strcmp(line, "drop") == 0) {
			hold.clear();
			say("dropped");
		}
	}
	return 0;
}
