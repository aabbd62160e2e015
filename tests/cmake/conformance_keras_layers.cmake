# The layers beyond the seed CNN's (AveragePooling2D, GlobalAveragePooling2D, Dropout, Conv2D and
# Dense with sigmoid, tanh and gelu; dilated and grouped Conv2D, DepthwiseConv2D, SeparableConv2D,
# Conv1D, MaxPooling1D) against Keras 3 on the same weights and inputs: logits and every
# variable's gradient to 1e-5 relative, and the .keras files libdist writes for the convolution
# variants (tests/conformance/keras_layers.py). Needs the venv of the conformance.venv fixture
# (tests/cmake/conformance.cmake).
add_executable(keras_layers ${CMAKE_CURRENT_SOURCE_DIR}/conformance/keras_layers.c)
target_link_libraries(keras_layers PRIVATE dist_internal)
target_compile_options(keras_layers PRIVATE ${DIST_WARNINGS})
add_test(NAME conformance.keras_layers
         COMMAND ${DIST_CONF_VENV}/bin/python ${CMAKE_CURRENT_SOURCE_DIR}/conformance/keras_layers.py
                 $<TARGET_FILE:keras_layers> ${CMAKE_CURRENT_BINARY_DIR}/keras_layers_work
                 $<TARGET_FILE:keras_functional>)
set_tests_properties(conformance.keras_layers PROPERTIES FIXTURES_REQUIRED tf_venv
                     LABELS conformance TIMEOUT 600 ENVIRONMENT "TF_CPP_MIN_LOG_LEVEL=2")

# SyncBatchNorm: libdist's mirrored strategy on two CPU replicas against Keras 3's
# BatchNormalization(synchronized=True) under tf.distribute.MirroredStrategy on two logical CPUs:
# each replica's logits and gradients and the moving statistics after one step, to 1e-5
# relative (tests/conformance/keras_sync_bn.py).
add_executable(keras_sync_bn ${CMAKE_CURRENT_SOURCE_DIR}/conformance/keras_sync_bn.c)
target_link_libraries(keras_sync_bn PRIVATE dist_internal)
target_compile_options(keras_sync_bn PRIVATE ${DIST_WARNINGS})
add_test(NAME conformance.keras_sync_bn
         COMMAND ${DIST_CONF_VENV}/bin/python ${CMAKE_CURRENT_SOURCE_DIR}/conformance/keras_sync_bn.py
                 $<TARGET_FILE:keras_sync_bn> ${CMAKE_CURRENT_BINARY_DIR}/keras_sync_bn_work)
set_tests_properties(conformance.keras_sync_bn PROPERTIES FIXTURES_REQUIRED tf_venv
                     LABELS conformance TIMEOUT 600 ENVIRONMENT "TF_CPP_MIN_LOG_LEVEL=2")

# A Functional model (a small ResNet: skips, a projection shortcut, BatchNormalization, ReLU
# layers) from tf_keras's and Keras 3's JSON, trained 20 SGD steps against both Keras: losses
# to 1e-5, weights to 2e-4, and libdist's .weights.h5 loaded back by Keras 3
# (tests/conformance/keras_functional.py).
add_executable(keras_functional ${CMAKE_CURRENT_SOURCE_DIR}/conformance/keras_functional.c)
target_link_libraries(keras_functional PRIVATE dist_internal)
target_compile_options(keras_functional PRIVATE ${DIST_WARNINGS})
add_test(NAME conformance.keras_functional
         COMMAND ${DIST_CONF_VENV}/bin/python
                 ${CMAKE_CURRENT_SOURCE_DIR}/conformance/keras_functional.py
                 $<TARGET_FILE:keras_functional> ${CMAKE_CURRENT_BINARY_DIR}/keras_functional_work 20)
set_tests_properties(conformance.keras_functional PROPERTIES FIXTURES_REQUIRED tf_venv
                     LABELS conformance TIMEOUT 600 ENVIRONMENT "TF_CPP_MIN_LOG_LEVEL=2")

# The layers of Functional graphs (Add, Subtract, Multiply, Average, Concatenate, ZeroPadding2D,
# Rescaling, Reshape, ReLU, Softmax, Activation, LayerNormalization, GlobalMaxPooling2D) against
# Keras 3 through the keras_layers driver: logits and every gradient to 1e-5 relative of
# float64 Keras; and each model written back by dist_model_save_keras opens in Keras's
# load_model with the original's outputs (tests/conformance/keras_graph_layers.py).
add_test(NAME conformance.keras_graph_layers
         COMMAND ${DIST_CONF_VENV}/bin/python
                 ${CMAKE_CURRENT_SOURCE_DIR}/conformance/keras_graph_layers.py
                 $<TARGET_FILE:keras_layers> ${CMAKE_CURRENT_BINARY_DIR}/keras_graph_layers_work
                 $<TARGET_FILE:keras_functional>)
set_tests_properties(conformance.keras_graph_layers PROPERTIES FIXTURES_REQUIRED tf_venv
                     LABELS conformance TIMEOUT 600 ENVIRONMENT "TF_CPP_MIN_LOG_LEVEL=2")

# A text classifier's layers (an int32 InputLayer, Embedding, Dense on every step, Add,
# LayerNormalization, GlobalAveragePooling1D), a Transformer block and a recurrent stack
# (LSTM, GRU of both forms, SimpleRNN, go_backwards) against Keras 3 on the same weights and
# ids: logits and every gradient to 1e-5 relative of float64 Keras; the recurrent stack also
# through libdist's .keras file (tests/conformance/keras_text.py).
add_executable(keras_text ${CMAKE_CURRENT_SOURCE_DIR}/conformance/keras_text.c)
target_link_libraries(keras_text PRIVATE dist_internal)
target_compile_options(keras_text PRIVATE ${DIST_WARNINGS})
add_test(NAME conformance.keras_text
         COMMAND ${DIST_CONF_VENV}/bin/python ${CMAKE_CURRENT_SOURCE_DIR}/conformance/keras_text.py
                 $<TARGET_FILE:keras_text> ${CMAKE_CURRENT_BINARY_DIR}/keras_text_work
                 $<TARGET_FILE:keras_functional>)
set_tests_properties(conformance.keras_text PROPERTIES FIXTURES_REQUIRED tf_venv
                     LABELS conformance TIMEOUT 600 ENVIRONMENT "TF_CPP_MIN_LOG_LEVEL=2")
