# Installation of the deployment files and documentation, and the Debian
# package: `cpack -G DEB` in the build directory (prefix /usr).
#
# Paths stay relative to the install prefix, so `cmake --install --prefix DIR`
# never writes outside DIR: the unit goes to lib/systemd/system, the
# sysusers.d and tmpfiles.d entries to lib/sysusers.d and lib/tmpfiles.d
# (/usr/lib/... in the package), the example config to share/doc. The
# package's postinst creates the `memtally` group and, if absent,
# /etc/memtally/memtallyd.conf from the example with `group = memtally`,
# mode 0640 root:memtally (it may hold the TCP token).
if(NOT MEMTALLY_TOP_LEVEL)  # a subproject of someone else's build
  return()
endif()

set(_deploy ${PROJECT_SOURCE_DIR}/deploy)
# The unit names the daemon where this install puts it: the prefix is
# known only when the install runs (cmake --install --prefix), so the
# file is written then. Under /usr/local, systemd finds the unit in
# /usr/local/lib/systemd/system, which ran /usr/bin/memtallyd: not there.
set(_unit ${PROJECT_BINARY_DIR}/deploy/memtallyd.service)
if(IS_ABSOLUTE "${CMAKE_INSTALL_BINDIR}")
  set(_bindir "${CMAKE_INSTALL_BINDIR}")
else()
  set(_bindir "\${CMAKE_INSTALL_PREFIX}/${CMAKE_INSTALL_BINDIR}")
endif()
install(CODE "
  file(READ \"${_deploy}/memtallyd.service\" _u)
  string(REPLACE \"ExecStart=/usr/bin/memtallyd \"
         \"ExecStart=${_bindir}/memtallyd \"
         _u \"\${_u}\")
  file(WRITE \"${_unit}\" \"\${_u}\")
")
install(FILES ${_unit} DESTINATION lib/systemd/system)
install(FILES ${_deploy}/memtally.sysusers DESTINATION lib/sysusers.d
        RENAME memtally.conf)
install(FILES ${_deploy}/memtally.tmpfiles DESTINATION lib/tmpfiles.d
        RENAME memtally.conf)
install(FILES ${_deploy}/memtallyd.conf ${_deploy}/kubernetes/memtally.yaml
        DESTINATION ${CMAKE_INSTALL_DOCDIR}/examples)
# The Python package (client, `python3 -m memtally`, Celery and Dask
# integrations),
# where Debian's python3 looks for packages, with its generated protobuf
# module inside it.
file(GLOB _pyfiles ${PROJECT_SOURCE_DIR}/python/memtally/*.py)
install(FILES ${_pyfiles} DESTINATION lib/python3/dist-packages/memtally)
install(FILES ${PROJECT_BINARY_DIR}/python/memtally_pb2.py OPTIONAL
        DESTINATION lib/python3/dist-packages/memtally)
install(DIRECTORY ${_deploy}/prometheus ${_deploy}/slurm
        DESTINATION ${CMAKE_INSTALL_DOCDIR}/examples
        USE_SOURCE_PERMISSIONS)
# Slurm: the task wrapper users put after srun on PATH; the hook (memtallyd
# [hooks]) and the TaskProlog where slurm.conf and memtallyd.conf name them.
install(PROGRAMS ${_deploy}/slurm/memtally-slurm-task DESTINATION ${CMAKE_INSTALL_BINDIR})
install(PROGRAMS ${_deploy}/slurm/memtally-slurm-hook ${_deploy}/slurm/memtally-slurm-taskprolog
        DESTINATION ${CMAKE_INSTALL_LIBEXECDIR}/memtally)
install(FILES ${PROJECT_SOURCE_DIR}/proto/memtally.proto
        DESTINATION ${CMAKE_INSTALL_DATADIR}/memtally/proto)
install(FILES ${PROJECT_SOURCE_DIR}/README.md DESTINATION ${CMAKE_INSTALL_DOCDIR})
# The pages the README links to, at the same relative paths.
install(FILES ${PROJECT_SOURCE_DIR}/docs/COUNTING.md ${PROJECT_SOURCE_DIR}/docs/OPERATIONS.md
        DESTINATION ${CMAKE_INSTALL_DOCDIR}/docs)
foreach(_page memtallyd.8 memtally.1)
  if(EXISTS ${PROJECT_SOURCE_DIR}/docs/${_page})
    string(REGEX REPLACE ".*\\." "" _sec ${_page})
    install(FILES ${PROJECT_SOURCE_DIR}/docs/${_page}
            DESTINATION ${CMAKE_INSTALL_MANDIR}/man${_sec})
  endif()
endforeach()

set(CPACK_PACKAGE_NAME memtally)
set(CPACK_PACKAGE_VENDOR "memtally")
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY
    "memory accounting for a fleet of worker processes")
set(CPACK_PACKAGE_CONTACT "memtally maintainers <memtally@localhost>")
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_GENERATOR DEB)
set(CPACK_SOURCE_GENERATOR TGZ)
set(CPACK_SOURCE_IGNORE_FILES "/\\\\.git/" "/build[^/]*/")
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION admin)
set(CPACK_DEBIAN_PACKAGE_PRIORITY optional)
set(CPACK_DEBIAN_PACKAGE_HOMEPAGE "https://example.invalid/memtally")
set(CPACK_DEBIAN_PACKAGE_DESCRIPTION
"memtally counts the heap bytes of every worker process on a machine, cheaply
enough to leave on in production: an LD_PRELOAD interposer (or the linked
libmemtally) counts per thread and flushes into shared memory; memtallyd
sums the counters every tick, enforces fleet, group and process limits and
answers a scheduler's Admit requests over a Unix socket, so work is refused
before the kernel's OOM killer has to pick a victim.

Contains memtallyd, the memtally command-line tool, libmemtally (headers,
pkg-config and CMake files), libmemtally_preload.so, a systemd unit and
man pages.")
# Library dependencies from dpkg-shlibdeps (jemalloc, libuv, protobuf-c, ...).
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_RECOMMENDS "systemd")
set(CPACK_DEBIAN_PACKAGE_CONTROL_EXTRA ${PROJECT_SOURCE_DIR}/cmake/deb/postinst)
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON)
include(CPack)
