# The benchmark zoo (bench/models/zoo.py) against tf_keras step by step, each model libdist loads:
# 20 SGD steps from the same weights and batches (tests/conformance/keras_zoo.py, with the driver
# of conformance.keras_functional, which reads the Transformer's int32 token ids). The seed CNN
# is conformance.keras_steps; the Transformer runs at the zoo's full size (sequence 128,
# vocabulary 20000) at batch 8. Then Keras 3 loads the trained model's .keras
# (keras.models.load_model; MultiHeadAttention included) and .weights.h5 files that libdist
# wrote, each giving libdist's logits within 1e-5. Needs the venv fixture of conformance.cmake.
foreach(zoo_case "resnet20;8" "mlp;32" "transformer;8")
  list(GET zoo_case 0 zoo_model)
  list(GET zoo_case 1 zoo_batch)
  add_test(NAME conformance.keras_zoo_${zoo_model}
           COMMAND ${DIST_CONF_VENV}/bin/python ${CMAKE_CURRENT_SOURCE_DIR}/conformance/keras_zoo.py
                   $<TARGET_FILE:keras_functional> ${CMAKE_CURRENT_BINARY_DIR}/keras_zoo_${zoo_model}
                   ${zoo_model} ${zoo_batch} 20)
  set_tests_properties(conformance.keras_zoo_${zoo_model} PROPERTIES FIXTURES_REQUIRED tf_venv
                       LABELS conformance TIMEOUT 900)
endforeach()
# The MLP and the Transformer under mixed_bfloat16: tf_keras builds them under that global
# policy and libdist reads it from the JSON (keras_zoo.py's sixth argument; bounds there).
foreach(zoo_case "mlp;32" "transformer;8")
  list(GET zoo_case 0 zoo_model)
  list(GET zoo_case 1 zoo_batch)
  add_test(NAME conformance.keras_zoo_${zoo_model}_mixed_bfloat16
           COMMAND ${DIST_CONF_VENV}/bin/python ${CMAKE_CURRENT_SOURCE_DIR}/conformance/keras_zoo.py
                   $<TARGET_FILE:keras_functional>
                   ${CMAKE_CURRENT_BINARY_DIR}/keras_zoo_${zoo_model}_mixed_bfloat16
                   ${zoo_model} ${zoo_batch} 20 mixed_bfloat16)
  set_tests_properties(conformance.keras_zoo_${zoo_model}_mixed_bfloat16 PROPERTIES
                       FIXTURES_REQUIRED tf_venv LABELS conformance TIMEOUT 900)
endforeach()
# Each layer alone under mixed_bfloat16 against tf_keras in a tf.function: TF's bits where its
# bfloat16 products round once (tests/conformance/keras_layers_mixed.py)
add_test(NAME conformance.keras_layers_mixed_bfloat16
         COMMAND ${DIST_CONF_VENV}/bin/python ${CMAKE_CURRENT_SOURCE_DIR}/conformance/keras_layers_mixed.py
                 $<TARGET_FILE:keras_functional> ${CMAKE_CURRENT_BINARY_DIR}/keras_layers_mixed)
set_tests_properties(conformance.keras_layers_mixed_bfloat16 PROPERTIES FIXTURES_REQUIRED tf_venv
                     LABELS conformance TIMEOUT 900)
