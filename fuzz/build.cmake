# cmake -P script of the fuzz_build test (tests/fuzz_tests.cmake): configures and builds fuzz/
# into BINARY_DIR with clang, and makes each target's working directory, where its new corpus
# inputs, scratch files and saved findings go.
#   -DSOURCE_DIR=fuzz -DBINARY_DIR=... -DCXX=clang++ -DCC=clang [-DLAUNCHER=ccache]
#   -DCORE_SOURCES=a.cpp|b.cpp|...   (hpc_train_core's sources, '|'-separated)
#   -DTARGETS=idx|cifar10|...
string(REPLACE "|" ";" targets "${TARGETS}")
set(configure ${CMAKE_COMMAND} -S ${SOURCE_DIR} -B ${BINARY_DIR} -G Ninja
    -DCMAKE_CXX_COMPILER=${CXX} -DCMAKE_C_COMPILER=${CC}
    "-DHPC_TRAIN_CORE_SOURCES=${CORE_SOURCES}")  # '|'-separated: a list would split here
if(LAUNCHER)
  list(APPEND configure -DCMAKE_CXX_COMPILER_LAUNCHER=${LAUNCHER})
endif()
execute_process(COMMAND ${configure} RESULT_VARIABLE result)
if(NOT result EQUAL 0)
  message(FATAL_ERROR "configuring the fuzz targets failed (${result})")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} --build ${BINARY_DIR} RESULT_VARIABLE result)
if(NOT result EQUAL 0)
  message(FATAL_ERROR "building the fuzz targets failed (${result})")
endif()
foreach(target IN LISTS targets)
  file(MAKE_DIRECTORY ${BINARY_DIR}/work/${target}/corpus)
endforeach()
