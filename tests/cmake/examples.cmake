# The examples build and run.
add_test(NAME example.custom_training_loop COMMAND $<TARGET_FILE:example_custom_training_loop> 50)
set_tests_properties(example.custom_training_loop PROPERTIES LABELS example TIMEOUT 300
                     PASS_REGULAR_EXPRESSION "trained 50 steps")
