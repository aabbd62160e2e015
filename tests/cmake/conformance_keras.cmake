# Training itself against Keras: the seed CNN trained by libdist and by tf_keras from the same
# initial weights on the same batches, loss of every step and final weights compared
# (tests/conformance/keras_steps.py says the cases and tolerances). Needs the venv fixture of
# conformance.cmake.
add_executable(keras_steps ${CMAKE_CURRENT_SOURCE_DIR}/conformance/keras_steps.c)
target_link_libraries(keras_steps PRIVATE dist_internal)
target_compile_options(keras_steps PRIVATE ${DIST_WARNINGS})
add_test(NAME conformance.keras_steps
         COMMAND ${DIST_CONF_VENV}/bin/python ${CMAKE_CURRENT_SOURCE_DIR}/conformance/keras_steps.py
                 $<TARGET_FILE:keras_steps> ${CMAKE_CURRENT_BINARY_DIR}/keras_steps_work 50)
set_tests_properties(conformance.keras_steps PROPERTIES FIXTURES_REQUIRED tf_venv
                     LABELS conformance TIMEOUT 900 RUN_SERIAL TRUE)
