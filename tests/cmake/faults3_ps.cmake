# Issue #37, parameter_server faults (tests/cli/ps_cluster.py starts the tasks by hand).
set(ps_cluster3 ${CMAKE_CURRENT_SOURCE_DIR}/cli/ps_cluster.py)
# 1. A worker SIGSTOPped in epoch 2 (hung, its connection open): with --collective-timeout 3 its
# closure is re-queued once the deadline passes, and the job ends within the timeout plus a few
# seconds of training, exit 0 (before: the chief waited 600 s, the closure deadline then).
add_test(NAME distrain.i37.ps_hung_worker
         COMMAND python3 ${ps_cluster3} --workers 2 --ps 1 --timeout 120 --kill worker/1
                 --kill-signal STOP --kill-after "Epoch 2/3" --chief-within 15
                 --expect "lost worker/1 at 127\\.0\\.0\\.1:[0-9]+.*closure #[0-9]+ 'distrain\\.train' re-queued"
                 --expect "Test loss" --
                 $<TARGET_FILE:distrain> --strategy parameter_server --epochs 3 --collective-timeout 3)
# ... and woken 6 s later it rejoins the job, which ends with every task exiting 0.
add_test(NAME distrain.i37.ps_hung_worker_wakes
         COMMAND python3 ${ps_cluster3} --workers 2 --ps 1 --timeout 180 --kill worker/1
                 --kill-signal STOP --cont-after 6 --kill-after "Epoch 2/30"
                 --expect "re-queued" --expect "worker/1 at 127\\.0\\.0\\.1:[0-9]+ rejoined"
                 --expect "Test loss" --
                 $<TARGET_FILE:distrain> --strategy parameter_server --epochs 30 --collective-timeout 3)
set_tests_properties(distrain.i37.ps_hung_worker distrain.i37.ps_hung_worker_wakes
                     PROPERTIES LABELS "cli;ps" TIMEOUT 300 RUN_SERIAL TRUE)
# 2. --backup-freq under parameter_server: a backup inside an epoch could be written but never
# resumed (the workers' data positions are their own): a usage error before anything starts.
add_test(NAME distrain.i37.ps_backup_freq_refused
         COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/cli/expect.sh 2
                 "--backup-freq: a backup inside an epoch cannot be resumed under parameter_server"
                 $<TARGET_FILE:distrain> --strategy parameter_server --workers 2 --ps 1
                 --backup-dir ${CMAKE_CURRENT_BINARY_DIR}/i37_bk --backup-freq 10)
set_tests_properties(distrain.i37.ps_backup_freq_refused PROPERTIES LABELS cli TIMEOUT 60)
