# `cmake --install build --prefix PREFIX`: the programs, the job scripts, the example configs
# and the modulefiles (Lmod and Tcl) of an installation. Included by CMakeLists.txt after the
# targets and dependencies are known.

# An installed hpc_train finds a LibTorch (or MPI, HDF5, CUDA) outside the system paths, e.g. the
# Python wheel's, where the build found it: every directory it linked from that is not a system
# one goes into its RUNPATH (tests/test_install.sh runs it from an empty environment).
set_target_properties(hpc_train hpc_train_data PROPERTIES INSTALL_RPATH_USE_LINK_PATH ON)
# INSTALL_RPATH_USE_LINK_PATH leaves out directories inside the source and build trees (CMake
# takes them for the project's own outputs), but a dependency may have been unpacked there (a
# Boost extracted into the checkout, say): the installed program would not find it. Those
# directories go in by hand.
foreach(target IN ITEMS Boost::program_options ZLIB::ZLIB JPEG::JPEG PNG::PNG)
  if(NOT TARGET ${target})
    continue()
  endif()
  get_target_property(location ${target} LOCATION)
  if(location)
    get_filename_component(dir "${location}" DIRECTORY)
    string(FIND "${dir}/" "${PROJECT_SOURCE_DIR}/" in_source_tree)
    string(FIND "${dir}/" "${PROJECT_BINARY_DIR}/" in_build_tree)
    if(in_source_tree EQUAL 0 OR in_build_tree EQUAL 0)
      set_property(TARGET hpc_train hpc_train_data APPEND PROPERTY INSTALL_RPATH "${dir}")
    endif()
  endif()
endforeach()
install(TARGETS hpc_train hpc_train_data RUNTIME DESTINATION bin)
install(DIRECTORY "${PROJECT_SOURCE_DIR}/jobscripts/" DESTINATION share/hpc_train/jobscripts
        USE_SOURCE_PERMISSIONS)
install(DIRECTORY "${PROJECT_SOURCE_DIR}/configs/" DESTINATION share/hpc_train/configs)

# The MPI, HDF5 and CUDA this build uses, for the installed modulefiles: their bin and lib
# directories, so that `module load hpc_train` gives the mpirun and libraries hpc_train was built
# with rather than the site's default modules. System directories are left out (the loader and
# PATH have them already; prepending /usr/bin would shadow the user's other modules).
set(system_dirs /bin /usr/bin /sbin /usr/sbin ${CMAKE_PLATFORM_IMPLICIT_LINK_DIRECTORIES}
    ${CMAKE_C_IMPLICIT_LINK_DIRECTORIES} ${CMAKE_CXX_IMPLICIT_LINK_DIRECTORIES})
set(system_real_dirs "")
foreach(dir IN LISTS system_dirs)
  get_filename_component(real_dir "${dir}" REALPATH)
  list(APPEND system_real_dirs "${real_dir}")
endforeach()

set(bin_candidates "")
set(lib_candidates "")
foreach(program IN ITEMS "${MPIEXEC_EXECUTABLE}" "${HDF5_C_COMPILER_EXECUTABLE}")
  if(IS_ABSOLUTE "${program}")
    get_filename_component(dir "${program}" DIRECTORY)
    list(APPEND bin_candidates "${dir}")
  endif()
endforeach()
set(linked_libraries ${MPI_C_LIBRARIES} ${MPI_CXX_LIBRARIES} ${HDF5_C_LIBRARIES})
if(TORCH_CUDA_LIBRARIES)
  list(APPEND bin_candidates "${CUDAToolkit_BIN_DIR}")
  list(APPEND lib_candidates "${CUDAToolkit_LIBRARY_DIR}")
  list(APPEND linked_libraries "${NCCL_LIBRARY}")
endif()
foreach(library IN LISTS linked_libraries)
  if(IS_ABSOLUTE "${library}")
    get_filename_component(dir "${library}" DIRECTORY)
    list(APPEND lib_candidates "${dir}")
  endif()
endforeach()

foreach(kind BIN LIB)
  string(TOLOWER "${kind}" lower_kind)
  set(recorded "")
  foreach(dir IN LISTS ${lower_kind}_candidates)
    get_filename_component(real_dir "${dir}" REALPATH)
    if(dir AND IS_DIRECTORY "${dir}" AND NOT dir IN_LIST system_dirs
       AND NOT real_dir IN_LIST system_real_dirs)
      list(APPEND recorded "${dir}")
    endif()
  endforeach()
  list(REMOVE_DUPLICATES recorded)
  # Cached for tests/slurm/test_lmod_module.sh, which checks that loading puts them first.
  set(HPC_TRAIN_MODULE_${kind}_DIRS "${recorded}" CACHE INTERNAL
      "${kind} directories of the MPI/HDF5/CUDA of this build, for the installed modulefiles")
endforeach()
message(STATUS "hpc_train: modulefiles prepend PATH '${HPC_TRAIN_MODULE_BIN_DIRS}', "
               "LD_LIBRARY_PATH '${HPC_TRAIN_MODULE_LIB_DIRS}'")

configure_file("${PROJECT_SOURCE_DIR}/cmake/install_modulefile.cmake.in"
               "${PROJECT_BINARY_DIR}/install_modulefile.cmake" @ONLY)
install(SCRIPT "${PROJECT_BINARY_DIR}/install_modulefile.cmake")
