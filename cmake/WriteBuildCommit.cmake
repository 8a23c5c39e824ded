# Writes OUTPUT (build_commit.h) with the git commit of SOURCE_DIR, "+changes" when the work tree
# differs from it, or "unknown" outside git. Run at every build (not only at configure time), so
# that --version names the commit that was built; the file is rewritten only when the text
# changes, so nothing recompiles when the commit stays the same.
set(commit "unknown")
find_package(Git QUIET)
if(GIT_FOUND)
  execute_process(COMMAND "${GIT_EXECUTABLE}" -C "${SOURCE_DIR}" rev-parse --short=12 HEAD
                  OUTPUT_VARIABLE head RESULT_VARIABLE head_rc ERROR_QUIET
                  OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(head_rc EQUAL 0 AND head)
    set(commit "${head}")
    execute_process(COMMAND "${GIT_EXECUTABLE}" -C "${SOURCE_DIR}" status --porcelain
                            --untracked-files=no
                    OUTPUT_VARIABLE changes RESULT_VARIABLE status_rc ERROR_QUIET)
    if(status_rc EQUAL 0 AND changes)
      set(commit "${commit}+changes")
    endif()
  endif()
endif()
set(text "#pragma once\n#define HPC_TRAIN_BUILD_COMMIT \"${commit}\"\n")
if(EXISTS "${OUTPUT}")
  file(READ "${OUTPUT}" old_text)
endif()
if(NOT "${text}" STREQUAL "${old_text}")
  file(WRITE "${OUTPUT}" "${text}")
endif()
