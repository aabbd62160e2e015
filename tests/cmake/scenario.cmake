# Every strategy x every feature through distrain (tests/scenario/scenario.py): ~2 minutes on
# the project's 2 cores; label `scenario`.
add_test(NAME scenario.strategies_x_features
         COMMAND python3 ${CMAKE_CURRENT_SOURCE_DIR}/scenario/scenario.py $<TARGET_FILE:distrain>
                 ${CMAKE_CURRENT_BINARY_DIR}/jpeg_mnist ${CMAKE_CURRENT_BINARY_DIR}/scenario)
set_tests_properties(scenario.strategies_x_features PROPERTIES LABELS scenario TIMEOUT 900
                     FIXTURES_REQUIRED jpeg_mnist RUN_SERIAL TRUE)
