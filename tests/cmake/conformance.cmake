# Conformance against TensorFlow itself: TF_CONFIG resolved by TensorFlow's TFConfigClusterResolver
# and multi_worker_util versus libdist's dist_cluster_from_tf_config, case by case.
# The fixture builds (once, cached) a venv with tensorflow-cpu; it needs PyPI the first time and
# fails loudly without it.
set(conf_dir ${CMAKE_CURRENT_SOURCE_DIR}/conformance)
add_executable(cluster_json ${conf_dir}/cluster_json.c)
target_link_libraries(cluster_json PRIVATE dist_internal)
target_compile_options(cluster_json PRIVATE ${DIST_WARNINGS})


add_test(NAME conformance.venv COMMAND ${conf_dir}/venv.sh)
set_tests_properties(conformance.venv PROPERTIES FIXTURES_SETUP tf_venv LABELS conformance
                     TIMEOUT 900 ENVIRONMENT "DIST_VENV=${DIST_CONF_VENV}")

add_test(NAME conformance.tf_config
         COMMAND ${DIST_CONF_VENV}/bin/python ${conf_dir}/run_tf_config.py ${DIST_CONF_VENV}/bin/python
                 $<TARGET_FILE:cluster_json> ${conf_dir}/tf_config_cases.json)
set_tests_properties(conformance.tf_config PROPERTIES FIXTURES_REQUIRED tf_venv
                     LABELS conformance TIMEOUT 600)

# The Slurm resolver against TensorFlow's SlurmClusterResolver on the same environments.
add_test(NAME conformance.slurm
         COMMAND ${DIST_CONF_VENV}/bin/python ${conf_dir}/run_slurm.py $<TARGET_FILE:cluster_json>)
set_tests_properties(conformance.slurm PROPERTIES FIXTURES_REQUIRED tf_venv
                     LABELS conformance TIMEOUT 600)
