# The examples build and run, and do what they are for: the custom training loop exits 0 and its
# loss falls (tests/cli/example_loss.cmake).
add_test(NAME example.custom_training_loop
         COMMAND ${CMAKE_COMMAND} -DEXAMPLE=$<TARGET_FILE:example_custom_training_loop> -DSTEPS=50
                 -DMAX_LOSS=1.2 -P ${CMAKE_CURRENT_SOURCE_DIR}/cli/example_loss.cmake)
set_tests_properties(example.custom_training_loop PROPERTIES LABELS example TIMEOUT 300)

# The residual network with SyncBatchNorm and a custom loss trains on 2 mirrored CPU replicas
# and reaches at least 97% on the built-in subset's test images (tests/cli/example_accuracy.cmake).
add_test(NAME example.custom_model
         COMMAND ${CMAKE_COMMAND} -DEXAMPLE=$<TARGET_FILE:example_custom_model> -DMIN_ACCURACY=0.97
                 -P ${CMAKE_CURRENT_SOURCE_DIR}/cli/example_accuracy.cmake)
set_tests_properties(example.custom_model PROPERTIES LABELS "example;slow" TIMEOUT 900)
