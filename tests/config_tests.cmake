# Config: command line, INI file, validation and the INI writer. Pure functions, one rank.
hpc_train_add_test(NAME test_config SOURCES test_config.cpp RANKS 1 LIBS hpc_train_core
                   LABELS config TIMEOUT 60)
