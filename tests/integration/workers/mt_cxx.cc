// mt_cxx - a C++ program using new/delete (all the operator variants the
// compiler emits for these expressions) and std containers; prints what it
// did and holds MIB MiB of std::vector<char> until stdin closes.
// usage: mt_cxx MIB
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include <dlfcn.h>

struct alignas(64) Wide {
	char bytes[256];
};

int main(int argc, char **argv)
{
	size_t mib = argc > 1 ? std::strtoul(argv[1], nullptr, 10) : 64;
	std::vector<std::unique_ptr<std::vector<char>>> hold;
	for (size_t i = 0; i < mib; i++)
		hold.emplace_back(new std::vector<char>(1 << 20, 'x'));
	// Array, aligned and nothrow forms, created and destroyed.
	for (int i = 0; i < 1000; i++) {
		auto *a = new int[100];
		auto *w = new Wide;
		auto *wa = new Wide[4];
		auto *nt = new (std::nothrow) char[300];
		delete[] a;
		delete w;
		delete[] wa;
		delete[] nt;
	}
	std::string s(1000, 'y');
	auto flush = reinterpret_cast<int (*)()>(
		dlsym(RTLD_DEFAULT, "memtally_flush"));
	if (flush)
		flush();
	std::cout << "ready held=" << hold.size() << " s=" << s.size()
		  << std::endl;
	int c;
	while ((c = std::getchar()) != EOF)
		;
	return 0;
}
