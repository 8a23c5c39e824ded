# The model zoo against PyTorch: model_zoo_reference.py builds every registered network in
# PyTorch (torchvision's, and bench/reference/models.py's) and writes its state_dict, an input,
# the logits and the FLOP counts; test_model_zoo compares hpc_train's networks with them. The
# files (1.5 GB, mostly VGG's classifiers) live only while the fixture's tests run.
# test_model_zoo_training trains one zoo network at 3 ranks with ZeRO-2.

# A Python with torch and torchvision (Debian: python3-torch python3-torchvision): the first
# python3 on the PATH that imports torchvision, else Debian's own, which a python3 earlier on
# the PATH (pyenv, a virtual environment) may hide.
set(HPC_TRAIN_TORCHVISION_PYTHON "" CACHE FILEPATH
    "Python with torch and torchvision, for the model zoo's reference (tests)")
if(NOT HPC_TRAIN_TORCHVISION_PYTHON)
  foreach(candidate python3 /usr/bin/python3)
    execute_process(COMMAND ${candidate} -c "import torchvision" RESULT_VARIABLE imports
                    OUTPUT_QUIET ERROR_QUIET)
    if(imports EQUAL 0)
      set(HPC_TRAIN_TORCHVISION_PYTHON ${candidate} CACHE FILEPATH
          "Python with torch and torchvision, for the model zoo's reference (tests)" FORCE)
      break()
    endif()
  endforeach()
endif()
set(zoo_python ${HPC_TRAIN_TORCHVISION_PYTHON})
if(NOT zoo_python)
  message(WARNING "No python3 imports torchvision: the test model_zoo_reference will fail. "
          "Install python3-torch python3-torchvision (run.sh does), or set "
          "HPC_TRAIN_TORCHVISION_PYTHON.")
  set(zoo_python python3)  # the script then says what is missing
endif()

set(zoo_reference_dir ${CMAKE_CURRENT_BINARY_DIR}/work/model_zoo)
add_test(NAME model_zoo_reference
  COMMAND ${zoo_python} ${CMAKE_CURRENT_SOURCE_DIR}/support/model_zoo_reference.py ${zoo_reference_dir})
set_tests_properties(model_zoo_reference PROPERTIES FIXTURES_SETUP model_zoo TIMEOUT 300
  LABELS models ENVIRONMENT "${HPC_TRAIN_TEST_ENV}")
add_test(NAME model_zoo_reference_cleanup COMMAND ${CMAKE_COMMAND} -E rm -rf ${zoo_reference_dir})
set_tests_properties(model_zoo_reference_cleanup PROPERTIES FIXTURES_CLEANUP model_zoo TIMEOUT 60
  LABELS models)

hpc_train_add_test(NAME test_model_zoo SOURCES test_model_zoo.cpp RANKS 1 LIBS hpc_train_engine
  LABELS models TIMEOUT 300)
set_tests_properties(test_model_zoo_np1 PROPERTIES FIXTURES_REQUIRED model_zoo)
set_property(TEST test_model_zoo_np1 APPEND PROPERTY ENVIRONMENT
  "HPC_TRAIN_MODEL_ZOO_REFERENCE=${zoo_reference_dir}")

hpc_train_add_test(NAME test_model_zoo_training SOURCES test_model_zoo_training.cpp RANKS 3
  LIBS hpc_train_engine hpc_train_test_support LABELS models TIMEOUT 300)
