# Runs one libFuzzer target for a bounded time; the ctest command of the
# fuzz/<target> tests (see CMakeLists.txt).
#
#   FUZZER       the fuzzer executable
#   SEEDS        committed seed corpus: read, never written
#   EXTRA_SEEDS  optional directory whose *.bin files are more seeds
#   DICT         optional libFuzzer dictionary
#   WORK         working directory in the build tree: WORK/corpus is a copy
#                of the seeds that the fuzzer grows across runs, and a
#                crashing input lands in WORK/artifacts/
#   SECONDS      -max_total_time
#   MAX_LEN      -max_len
foreach(v FUZZER SEEDS WORK SECONDS MAX_LEN)
  if(NOT DEFINED ${v} OR "${${v}}" STREQUAL "")
    message(FATAL_ERROR "run_fuzz.cmake: ${v} not set")
  endif()
endforeach()

file(MAKE_DIRECTORY ${WORK}/corpus ${WORK}/artifacts)
file(GLOB seeds ${SEEDS}/*)
if(EXTRA_SEEDS)
  file(GLOB extra ${EXTRA_SEEDS}/*.bin)
  list(APPEND seeds ${extra})
endif()
# The copies are writable whatever the source's permissions, so a later run
# can refresh them.
file(COPY ${seeds} DESTINATION ${WORK}/corpus NO_SOURCE_PERMISSIONS)

set(args -max_total_time=${SECONDS} -max_len=${MAX_LEN} -timeout=10
         -print_final_stats=1 -artifact_prefix=${WORK}/artifacts/)
if(DICT)
  list(APPEND args -dict=${DICT})
endif()
execute_process(COMMAND ${FUZZER} ${args} ${WORK}/corpus
                RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${FUZZER} failed (${rc}); the input is in ${WORK}/artifacts/")
endif()
