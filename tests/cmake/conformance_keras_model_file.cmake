# distrain's .keras model files opened by Keras 3 itself: a trained model's predictions on the
# test set, and --checkpoint-best-only keeping the epoch its monitor chose
# (tests/conformance/keras_model_file.py). libdist's predictions come from the keras_models
# driver of conformance_keras_models.cmake. Needs the venv fixture of conformance.cmake.
add_test(NAME conformance.keras_model_file
         COMMAND ${DIST_CONF_VENV}/bin/python ${CMAKE_CURRENT_SOURCE_DIR}/conformance/keras_model_file.py
                 $<TARGET_FILE:distrain> $<TARGET_FILE:keras_models>
                 ${CMAKE_CURRENT_BINARY_DIR}/keras_model_file_work
                 ${PROJECT_SOURCE_DIR}/src/data/mnist_subset/t10k-images-idx3-ubyte.gz)
set_tests_properties(conformance.keras_model_file PROPERTIES FIXTURES_REQUIRED tf_venv
                     LABELS conformance TIMEOUT 900)
