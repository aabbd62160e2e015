# Conformance of the training services' files against the Python packages that read them:
# TensorBoard event files (tensorboard's EventAccumulator, TensorFlow's summary_iterator) and
# safetensors checkpoints (safetensors.numpy, both directions). Needs the venv fixture of
# conformance.cmake (registered as conformance.venv, fixture name tf_venv).
set(conf_train_dir ${CMAKE_CURRENT_SOURCE_DIR}/conformance)
add_executable(train_artifacts ${conf_train_dir}/train_artifacts.c)
target_link_libraries(train_artifacts PRIVATE dist_internal)
target_compile_options(train_artifacts PRIVATE ${DIST_WARNINGS})


add_test(NAME conformance.tensorboard_events
         COMMAND ${DIST_CONF_VENV}/bin/python ${conf_train_dir}/check_tensorboard_events.py
                 $<TARGET_FILE:train_artifacts>)
add_test(NAME conformance.safetensors
         COMMAND ${DIST_CONF_VENV}/bin/python ${conf_train_dir}/check_safetensors.py
                 $<TARGET_FILE:train_artifacts>)
set_tests_properties(conformance.tensorboard_events conformance.safetensors PROPERTIES
                     FIXTURES_REQUIRED tf_venv LABELS conformance TIMEOUT 600
                     ENVIRONMENT "TF_CPP_MIN_LOG_LEVEL=2")
