# Issue #37, file faults (item 11): outputs on a disk that fills up during the run (a tmpfs in a private mount
# namespace; skipped where unshare -m or mount is not permitted). Every output keeps its last
# good state: whole CSV rows, whole TFRecords in the event files, the previous checkpoint and
# weights byte for byte, no temporary left, the weights rescued off the full disk.
add_test(NAME distrain.full_disk_keeps_every_output_whole
         COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/cli/full_disk.sh $<TARGET_FILE:distrain>
                 ${CMAKE_CURRENT_BINARY_DIR}/full_disk)
set_tests_properties(distrain.full_disk_keeps_every_output_whole
                     PROPERTIES LABELS cli TIMEOUT 300 SKIP_RETURN_CODE 77)
