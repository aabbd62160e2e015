# distrain's training services from the command line: backups, checkpoints, logs, traces.
# distrain --backup-dir: SIGKILL during epoch 3 of 5, restart, and the final weights equal an
# uninterrupted run's byte for byte; a bit-flipped newest backup is refused and the previous used.
add_test(NAME distrain.backup_resume
         COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/cli/backup_resume.sh $<TARGET_FILE:distrain>
                 ${CMAKE_CURRENT_BINARY_DIR}/backup_resume)
set_tests_properties(distrain.backup_resume PROPERTIES LABELS cli TIMEOUT 600)

# Directories that cannot be made (found before the first step: usage errors) and bad values: one-line messages and the documented codes.
set(expect_sh ${CMAKE_CURRENT_SOURCE_DIR}/cli/expect.sh)
add_test(NAME distrain.backup_dir_unwritable
         COMMAND ${expect_sh} 2 "--backup-dir: cannot create '/proc/distrain-backup'" $<TARGET_FILE:distrain> --quiet
                 --epochs 1 --steps-per-epoch 1 --backup-dir /proc/distrain-backup)
add_test(NAME distrain.checkpoint_dir_unwritable
         COMMAND ${expect_sh} 2 "--checkpoint-dir: cannot create '/proc/distrain-ckpt'" $<TARGET_FILE:distrain>
                 --quiet --epochs 1 --steps-per-epoch 1 --checkpoint-dir /proc/distrain-ckpt)
add_test(NAME distrain.logdir_unwritable
         COMMAND ${expect_sh} 2 "--logdir: cannot create '/proc/distrain-logs'" $<TARGET_FILE:distrain> --quiet --epochs 1
                 --steps-per-epoch 1 --logdir /proc/distrain-logs)
add_test(NAME distrain.validation_split_out_of_range
         COMMAND ${expect_sh} 2 "--validation-split" $<TARGET_FILE:distrain> --validation-split 1.5)
add_test(NAME distrain.patience_negative
         COMMAND ${expect_sh} 2 "--early-stopping-patience" $<TARGET_FILE:distrain>
                 --early-stopping-patience -1)
set_tests_properties(distrain.backup_dir_unwritable distrain.checkpoint_dir_unwritable
                     distrain.logdir_unwritable distrain.validation_split_out_of_range
                     distrain.patience_negative PROPERTIES LABELS cli TIMEOUT 120)

# distrain --trace FILE: a Chrome trace JSON timeline with every phase on every replica.
add_test(NAME distrain.trace
         COMMAND ${CMAKE_COMMAND} -DDISTRAIN=$<TARGET_FILE:distrain>
                 -DOUT=${CMAKE_CURRENT_BINARY_DIR}/trace.json -P ${CMAKE_CURRENT_SOURCE_DIR}/cli/trace.cmake)
set_tests_properties(distrain.trace PROPERTIES LABELS cli TIMEOUT 120)

# --check-numerics on a healthy run changes nothing visible: it trains and evaluates (the
# detection itself is pinned by unit.callbacks, which makes a layer overflow).
add_test(NAME distrain.check_numerics_clean_run
         COMMAND ${expect_sh} 0 "Test loss:" $<TARGET_FILE:distrain> --check-numerics --epochs 1
                 --steps-per-epoch 5 --threads 1)
set_tests_properties(distrain.check_numerics_clean_run PROPERTIES LABELS cli TIMEOUT 120)

# --mixed-precision / --loss-scale: bf16 accuracy against float32, fp16 overflow with dynamic
# scaling (skipped steps in the metrics JSON), a fixed scale that overflows, the fp16 default.
add_test(NAME distrain.mixed_precision
         COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/cli/mixed_precision.sh $<TARGET_FILE:distrain>
                 ${CMAKE_CURRENT_BINARY_DIR}/mixed_precision)
set_tests_properties(distrain.mixed_precision PROPERTIES LABELS cli TIMEOUT 600)
# --conv-algorithm winograd: oneDNN's Winograd forwards where it has them, the flag over
# DIST_CPU_WINOGRAD, and the accuracy of 2 epochs.
add_test(NAME distrain.conv_algorithm_winograd
         COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/cli/winograd.sh $<TARGET_FILE:distrain>
                 ${CMAKE_CURRENT_BINARY_DIR}/winograd)
set_tests_properties(distrain.conv_algorithm_winograd PROPERTIES LABELS cli TIMEOUT 300)
add_test(NAME distrain.conv_algorithm_invalid
         COMMAND ${expect_sh} 2 "expected direct or winograd" $<TARGET_FILE:distrain>
                 --conv-algorithm fast)
add_test(NAME distrain.mixed_precision_invalid
         COMMAND ${expect_sh} 2 "expected none, fp16 or bf16" $<TARGET_FILE:distrain>
                 --mixed-precision fp8)
add_test(NAME distrain.loss_scale_invalid
         COMMAND ${expect_sh} 2 "positive finite scale" $<TARGET_FILE:distrain> --loss-scale -4)
add_test(NAME distrain.loss_scale_dynamic_invalid
         COMMAND ${expect_sh} 2 "dynamic:INITIAL" $<TARGET_FILE:distrain> --loss-scale dynamic:x)
set_tests_properties(distrain.mixed_precision_invalid distrain.loss_scale_invalid
                     distrain.loss_scale_dynamic_invalid distrain.conv_algorithm_invalid
                     PROPERTIES LABELS cli TIMEOUT 60)

# --scale-lr: the learning rate scaled from --base-batch (64) to the global --batch-size, as
# TensorFlow's guides advise (linear: 0.001 * 256 / 64; sqrt: 0.01 * sqrt(256 / 64) for SGD's
# default), and the refusals.
add_test(NAME distrain.scale_lr_linear
         COMMAND ${expect_sh} 0 "Learning rate: 0.004 (0.001 scaled linear from batch 64 to global batch 256)"
                 $<TARGET_FILE:distrain> --scale-lr linear --batch-size 256 --epochs 1
                 --steps-per-epoch 1 --threads 1 --devices cpu:0)
add_test(NAME distrain.scale_lr_sqrt_sgd
         COMMAND ${expect_sh} 0 "Learning rate: 0.02 (0.01 scaled sqrt from batch 32 to global batch 128)"
                 $<TARGET_FILE:distrain> --scale-lr sqrt --base-batch 32 --batch-size 128
                 --optimizer sgd --epochs 1 --steps-per-epoch 1 --threads 1 --devices cpu:0)
add_test(NAME distrain.scale_lr_invalid
         COMMAND ${expect_sh} 2 "expected none, linear or sqrt" $<TARGET_FILE:distrain> --scale-lr cubic)
add_test(NAME distrain.base_batch_without_scale_lr
         COMMAND ${expect_sh} 2 "--base-batch needs --scale-lr" $<TARGET_FILE:distrain> --base-batch 32)
add_test(NAME distrain.scale_lr_with_schedule
         COMMAND ${expect_sh} 2 "--scale-lr scales --learning-rate, not a --lr-schedule"
                 $<TARGET_FILE:distrain> --scale-lr linear
                 --lr-schedule cosine_decay:initial_learning_rate=0.1,decay_steps=10)
set_tests_properties(distrain.scale_lr_linear distrain.scale_lr_sqrt_sgd distrain.scale_lr_invalid
                     distrain.base_batch_without_scale_lr distrain.scale_lr_with_schedule
                     PROPERTIES LABELS cli TIMEOUT 120)

# --target-accuracy A: the test split after every epoch, stopping after the first epoch that
# reaches A (bench/time_to_accuracy.sh uses it); a target not reached runs every epoch.
add_test(NAME distrain.target_accuracy
         COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/cli/target_accuracy.sh $<TARGET_FILE:distrain>
                 ${CMAKE_CURRENT_BINARY_DIR}/target_accuracy)
add_test(NAME distrain.target_accuracy_out_of_range
         COMMAND ${expect_sh} 2 "invalid value '1.5' for --target-accuracy" $<TARGET_FILE:distrain>
                 --target-accuracy 1.5)
add_test(NAME distrain.target_accuracy_with_epochs_0
         COMMAND ${expect_sh} 2 "--target-accuracy does nothing with --epochs 0" $<TARGET_FILE:distrain>
                 --target-accuracy 0.9 --epochs 0)
set_tests_properties(distrain.target_accuracy distrain.target_accuracy_out_of_range
                     distrain.target_accuracy_with_epochs_0 PROPERTIES LABELS cli TIMEOUT 300)

# --validation-split on a JPEG folder: the files are shuffled with the seed before the last
# fraction is held out (Keras's image_dataset_from_directory), so every class is validated.
add_test(NAME distrain.jpeg_validation_split_holds_every_class
         COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/cli/jpeg_validation_split.sh $<TARGET_FILE:distrain>
                 ${CMAKE_CURRENT_BINARY_DIR}/jpeg_mnist ${CMAKE_CURRENT_BINARY_DIR}/jpeg_validation_split)
set_tests_properties(distrain.jpeg_validation_split_holds_every_class PROPERTIES LABELS cli
                     TIMEOUT 300 FIXTURES_REQUIRED jpeg_mnist)
