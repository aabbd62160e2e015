# Every zoo model (bench/models/*.json) trained under one_device, mirrored, multi_worker (2 worker
# processes), tpu (XLA's CPU PJRT plugin, 2 replicas) and parameter_server (chief, 2 workers, 1
# ps processes) from the same weights and batches: the synchronous strategies' losses and final
# weights against one_device's, the asynchronous parameter_server held to training
# (tests/scenario/zoo_strategies.py says why and with which bounds). Label `scenario`.
add_executable(zoo_strategies ${CMAKE_CURRENT_SOURCE_DIR}/scenario/zoo_strategies.c)
target_link_libraries(zoo_strategies PRIVATE dist_internal)
target_include_directories(zoo_strategies PRIVATE ${PROJECT_SOURCE_DIR}/src)
target_compile_options(zoo_strategies PRIVATE ${DIST_WARNINGS})
add_test(NAME scenario.zoo_strategies
         COMMAND python3 ${CMAKE_CURRENT_SOURCE_DIR}/scenario/zoo_strategies.py
                 $<TARGET_FILE:zoo_strategies> ${DIST_TEST_PJRT_PLUGIN}
                 ${CMAKE_CURRENT_BINARY_DIR}/zoo_strategies_work)
set_tests_properties(scenario.zoo_strategies PROPERTIES FIXTURES_REQUIRED pjrt_venv
                     LABELS scenario TIMEOUT 900 RUN_SERIAL TRUE
                     ENVIRONMENT "${tpu_env};TF_CPP_MIN_LOG_LEVEL=2")
