# distrain --save-model (Keras 3 .keras files) and --checkpoint-best-only (ModelCheckpoint's
# save_best_only, monitor and mode): the files each mode writes, and usage errors named up front.
# Keras itself opening the files is conformance.keras_model_file.
set(kdir ${CMAKE_CURRENT_BINARY_DIR}/distrain_keras_model)
add_test(NAME distrain.checkpoint_best_only_modes
         COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/cli/checkpoint_best_only.sh $<TARGET_FILE:distrain>
                 ${kdir}/best_only)
set_tests_properties(distrain.checkpoint_best_only_modes PROPERTIES LABELS cli TIMEOUT 600)

# --save-model after a short run and with --epochs 0 (the initial weights): a zip whose entries
# are Keras's
add_test(NAME distrain.save_model_keras
         COMMAND ${CMAKE_COMMAND} -DDISTRAIN=$<TARGET_FILE:distrain> -DWORK=${kdir}/save_model
                 -P ${CMAKE_CURRENT_SOURCE_DIR}/cli/save_model.cmake)
set_tests_properties(distrain.save_model_keras PROPERTIES LABELS cli TIMEOUT 300)

distrain_error_test(save_model_not_keras 2 "'m.h5' must end in .keras" --save-model m.h5)
distrain_error_test(save_model_unwritable 2 "--save-model: cannot write '/nonexistent/m.keras'"
                    --save-model /nonexistent/m.keras)
distrain_error_test(checkpoint_best_only_alone 2 "--checkpoint-best-only needs --checkpoint-dir or --save-model"
                    --checkpoint-best-only)
distrain_error_test(checkpoint_best_only_val_loss_without_validation 2
                    "monitors val_loss (the default, as ModelCheckpoint's), which needs --validation-split"
                    --checkpoint-best-only --save-model ${CMAKE_CURRENT_BINARY_DIR}/usage_m.keras)
distrain_error_test(checkpoint_monitor_without_best_only 2 "--checkpoint-monitor needs --checkpoint-best-only"
                    --checkpoint-monitor loss --save-model ${CMAKE_CURRENT_BINARY_DIR}/usage_m.keras)
distrain_error_test(checkpoint_mode_without_best_only 2 "--checkpoint-mode needs --checkpoint-best-only"
                    --checkpoint-mode max --save-model ${CMAKE_CURRENT_BINARY_DIR}/usage_m.keras)
distrain_error_test(checkpoint_mode_unknown 2 "expected auto, min or max" --checkpoint-mode sideways)
distrain_error_test(checkpoint_monitor_unknown 2 "expected val_loss, val_accuracy, loss or accuracy"
                    --checkpoint-monitor val_auc)
distrain_error_test(checkpoint_best_only_epochs_0 2 "--checkpoint-best-only does nothing with --epochs 0"
                    --epochs 0 --checkpoint-best-only --checkpoint-monitor loss --save-model ${CMAKE_CURRENT_BINARY_DIR}/usage_m.keras)
# the evaluator waits for the last epoch's checkpoint, which best-only training may not write
distrain_error_test(evaluator_checkpoint_best_only 2
                    "--task evaluator: --checkpoint-best-only does not apply"
                    --task evaluator --checkpoint-dir ${CMAKE_CURRENT_BINARY_DIR} --checkpoint-best-only
                    --checkpoint-monitor loss)
