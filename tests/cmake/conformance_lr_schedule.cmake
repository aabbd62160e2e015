# Conformance of the learning-rate schedules and gradient clipping against TensorFlow itself:
# each schedule case of lr_schedule_cases.json is a tf.keras.optimizers.schedules object
# evaluated at steps 0..N-1, each clipping case one tf.keras.optimizers.SGD(learning_rate=1,
# clipnorm/clipvalue/global_clipnorm) step, versus dist_lr_schedule_parse/_value and
# dist_optimizer_set_clipping: relative 1e-6, or both refusing. Needs the venv of the
# conformance.venv fixture (tests/cmake/conformance.cmake).
set(lr_conf_dir ${CMAKE_CURRENT_SOURCE_DIR}/conformance)
add_executable(lr_schedule_cases ${lr_conf_dir}/lr_schedule_cases.c)
target_link_libraries(lr_schedule_cases PRIVATE dist_internal PkgConfig::CJSON)
target_compile_options(lr_schedule_cases PRIVATE ${DIST_WARNINGS})

add_test(NAME conformance.lr_schedules
         COMMAND ${DIST_CONF_VENV}/bin/python ${lr_conf_dir}/lr_schedule_run.py ${DIST_CONF_VENV}/bin/python
                 $<TARGET_FILE:lr_schedule_cases> ${lr_conf_dir}/lr_schedule_cases.json)
set_tests_properties(conformance.lr_schedules PROPERTIES FIXTURES_REQUIRED tf_venv
                     LABELS conformance TIMEOUT 600 ENVIRONMENT "TF_CPP_MIN_LOG_LEVEL=2")
