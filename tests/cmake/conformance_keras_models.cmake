# Keras models in and out against Keras 3: a model saved by Keras (to_json + .weights.h5) and
# loaded by libdist predicts what Keras predicts, and weights written by libdist load into Keras
# and predict what libdist predicts (tests/conformance/keras_models.py). Needs the venv fixture
# of conformance.cmake.
add_executable(keras_models ${CMAKE_CURRENT_SOURCE_DIR}/conformance/keras_models.c)
target_link_libraries(keras_models PRIVATE dist_internal)
target_compile_options(keras_models PRIVATE ${DIST_WARNINGS})
add_test(NAME conformance.keras_models
         COMMAND ${DIST_CONF_VENV}/bin/python ${CMAKE_CURRENT_SOURCE_DIR}/conformance/keras_models.py
                 $<TARGET_FILE:keras_models> ${CMAKE_CURRENT_BINARY_DIR}/keras_models_work)
set_tests_properties(conformance.keras_models PROPERTIES FIXTURES_REQUIRED tf_venv
                     LABELS conformance TIMEOUT 600)
