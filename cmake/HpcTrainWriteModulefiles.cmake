# Writes the modulefiles of an installation: modules/hpc_train/VERSION(.lua) with the install
# prefix and the MPI/HDF5/CUDA directories the build recorded filled in. Run by `cmake --install`
# (cmake/install_modulefile.cmake.in), and directly by tests/slurm/test_lmod_module.sh:
#   cmake -DMODULES_DIR=<source>/modules/hpc_train -DVERSION=0.1.0 -DPREFIX=<prefix>
#         "-DBIN_DIRS=a;b" "-DLIB_DIRS=c;d" -DOUTPUT_DIR=<dir> -P HpcTrainWriteModulefiles.cmake
# The modulefiles add only the directories that exist when loaded.

foreach(required MODULES_DIR VERSION PREFIX OUTPUT_DIR)
  if(NOT DEFINED ${required} OR "${${required}}" STREQUAL "")
    message(FATAL_ERROR "HpcTrainWriteModulefiles.cmake: ${required} is not set")
  endif()
endforeach()

# Written into Lua strings and Tcl braces unquoted: refuse the characters that would end them.
foreach(path IN LISTS PREFIX BIN_DIRS LIB_DIRS)
  if(path MATCHES "[\"\\\\{}\n\r]")
    message(FATAL_ERROR "hpc_train modulefiles: the path '${path}' has a quote, backslash, brace "
                        "or line break, which the modulefiles cannot hold")
  endif()
endforeach()

# replace_line(text_var old new file): replaces the line `old`, which must be in the file once
# (else the modulefile and this script are out of step).
function(replace_line text_var old new file)
  string(FIND "${${text_var}}" "\n${old}\n" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "hpc_train modulefiles: '${old}' is not a line of ${file}")
  endif()
  string(REPLACE "\n${old}\n" "\n${new}\n" text "${${text_var}}")
  set(${text_var} "${text}" PARENT_SCOPE)
endfunction()

# Lua: {"a", "b"}; Tcl: {{a} {b}}.
set(lua_bin_dirs "")
set(lua_lib_dirs "")
set(tcl_bin_dirs "")
set(tcl_lib_dirs "")
foreach(kind bin lib)
  string(TOUPPER "${kind}_DIRS" list_name)
  foreach(dir IN LISTS ${list_name})
    if(lua_${kind}_dirs)
      string(APPEND lua_${kind}_dirs ", ")
      string(APPEND tcl_${kind}_dirs " ")
    endif()
    string(APPEND lua_${kind}_dirs "\"${dir}\"")
    string(APPEND tcl_${kind}_dirs "{${dir}}")
  endforeach()
endforeach()

set(lua_file "${MODULES_DIR}/${VERSION}.lua")
file(READ "${lua_file}" lua_text)
replace_line(lua_text
  "local root = os.getenv(\"HPC_TRAIN_PREFIX\") or \"/opt/hpc_train/\" .. version"
  "local root = os.getenv(\"HPC_TRAIN_PREFIX\") or \"${PREFIX}\"" "${lua_file}")
replace_line(lua_text "local built_with = nil"
  "local built_with = {bin_dirs = {${lua_bin_dirs}}, lib_dirs = {${lua_lib_dirs}}}" "${lua_file}")

set(tcl_file "${MODULES_DIR}/${VERSION}")
file(READ "${tcl_file}" tcl_text)
replace_line(tcl_text "    set root /opt/hpc_train/$version" "    set root {${PREFIX}}" "${tcl_file}")
replace_line(tcl_text "set built_with_recorded 0" "set built_with_recorded 1" "${tcl_file}")
replace_line(tcl_text "set built_with_bin_dirs {}" "set built_with_bin_dirs {${tcl_bin_dirs}}" "${tcl_file}")
replace_line(tcl_text "set built_with_lib_dirs {}" "set built_with_lib_dirs {${tcl_lib_dirs}}" "${tcl_file}")

foreach(pair "${VERSION}.lua;lua_text" "${VERSION};tcl_text")
  list(GET pair 0 name)
  list(GET pair 1 text_var)
  message(STATUS "Installing: ${OUTPUT_DIR}/${name}")
  file(WRITE "${OUTPUT_DIR}/${name}" "${${text_var}}")
endforeach()
