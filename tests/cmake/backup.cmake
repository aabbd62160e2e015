# distrain --backup-dir: SIGKILL during epoch 3 of 5, restart, and the final weights equal an
# uninterrupted run's byte for byte; a bit-flipped newest backup is refused and the previous used.
add_test(NAME distrain.backup_resume
         COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/cli/backup_resume.sh $<TARGET_FILE:distrain>
                 ${CMAKE_CURRENT_BINARY_DIR}/backup_resume)
set_tests_properties(distrain.backup_resume PROPERTIES LABELS cli TIMEOUT 600)
