# multi_worker with real processes on loopback: the local launcher trains to the acceptance
# accuracy, a killed worker is named by the survivor, and bad cluster input is a clear error.
add_test(NAME distrain.accuracy_multi_worker
         COMMAND ${CMAKE_COMMAND} -DDISTRAIN=$<TARGET_FILE:distrain> -DSTRATEGY=multi_worker
                 "-DARGS=--workers;2"
                 -DOUT=${CMAKE_CURRENT_BINARY_DIR}/metrics_multi_worker.json
                 -P ${CMAKE_CURRENT_SOURCE_DIR}/cli/accuracy.cmake)
set_tests_properties(distrain.accuracy_multi_worker PROPERTIES LABELS "cli;slow" TIMEOUT 600
                     RUN_SERIAL TRUE)
add_test(NAME distrain.killed_worker_is_named
         COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/cli/kill_worker.sh $<TARGET_FILE:distrain>
                 ${CMAKE_CURRENT_BINARY_DIR}/kill_worker)
set_tests_properties(distrain.killed_worker_is_named PROPERTIES LABELS cli TIMEOUT 300 RUN_SERIAL TRUE)
distrain_error_test(workers_without_multi_worker 2 "--workers needs --strategy multi_worker"
                    --workers 2)
add_test(NAME distrain.multi_worker_bad_tf_config
         COMMAND ${CMAKE_COMMAND} -E env
                 "TF_CONFIG={\"cluster\":{\"worker\":[\"127.0.0.1:1\"]},\"task\":{\"type\":\"worker\",\"index\":5}}"
                 ${expect} 2 "TF_CONFIG" $<TARGET_FILE:distrain> --strategy multi_worker)
set_tests_properties(distrain.multi_worker_bad_tf_config PROPERTIES LABELS cli TIMEOUT 60)
add_test(NAME distrain.multi_worker_unreachable_peer
         COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/cli/unreachable_peer.sh ${expect} $<TARGET_FILE:distrain>)
set_tests_properties(distrain.multi_worker_unreachable_peer PROPERTIES LABELS cli TIMEOUT 60)
add_test(NAME distrain.multi_worker_only_chief_writes
         COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/cli/mw_chief_writes.sh $<TARGET_FILE:distrain>
                 ${CMAKE_CURRENT_BINARY_DIR}/mw_ckpt)
set_tests_properties(distrain.multi_worker_only_chief_writes PROPERTIES LABELS cli TIMEOUT 120
                     RUN_SERIAL TRUE)
if(TARGET dist_mpi AND MPIEXEC_EXECUTABLE)
  # distrain under mpiexec: the cluster from the MPI world, the MPI transport between workers.
  add_test(NAME distrain.multi_worker_mpi
           COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/cli/mpi_train.sh ${MPIEXEC_EXECUTABLE}
                   $<TARGET_FILE:distrain> ${CMAKE_CURRENT_BINARY_DIR}/mpi_train)
  set_tests_properties(distrain.multi_worker_mpi PROPERTIES LABELS "cli;slow" TIMEOUT 600
                       RUN_SERIAL TRUE)
endif()
# A hand-started worker without a cluster token (and without --insecure) refuses to start,
# naming the ways to give one.
add_test(NAME distrain.multi_worker_without_token_refuses
         COMMAND ${CMAKE_COMMAND} -E env --unset=DIST_CLUSTER_TOKEN --unset=DIST_CLUSTER_TOKEN_FILE
                 "TF_CONFIG={\"cluster\":{\"worker\":[\"127.0.0.1:1\",\"127.0.0.1:2\"]},\"task\":{\"type\":\"worker\",\"index\":1}}"
                 ${expect} 2 "--cluster-token-file" $<TARGET_FILE:distrain> --strategy multi_worker)
set_tests_properties(distrain.multi_worker_without_token_refuses PROPERTIES LABELS cli TIMEOUT 60)
# --transport tls: multi_worker (2 workers) and parameter_server (1 worker, 1 ps) reach the
# losses of plain TCP; the certificate flags need --transport tls.
add_test(NAME distrain.tls_same_loss_as_tcp
         COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/cli/tls_same_loss.sh $<TARGET_FILE:distrain>
                 ${CMAKE_CURRENT_BINARY_DIR}/tls_same_loss)
set_tests_properties(distrain.tls_same_loss_as_tcp PROPERTIES LABELS cli TIMEOUT 300 RUN_SERIAL TRUE)
distrain_error_test(tls_cert_without_tls 2 "--tls-cert needs --transport tls"
                    --strategy multi_worker --workers 2 --tls-cert cert.pem)
distrain_error_test(ps_transport_shm 2 "parameter_server takes tcp or tls"
                    --strategy parameter_server --workers 1 --ps 1 --transport shm)
