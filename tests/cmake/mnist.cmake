# MNIST downloads end to end: libcurl against a small HTTP server that test_mnist runs in a
# thread on 127.0.0.1 (a port the kernel picks, so never a taken one), serving fixture IDX
# files. This is the "download" case of the mnist suite as its own test (unit.mnist runs it
# too, with the offline cases). Bounded: each download test is killed after 30 s (its tcase
# timeout), the run after 120 s; every socket wait inside has a deadline.
if(TARGET test_mnist)
  add_test(NAME mnist.download COMMAND test_mnist)
  set_tests_properties(mnist.download PROPERTIES LABELS integration TIMEOUT 120
                       ENVIRONMENT "CK_RUN_CASE=download;OMP_NUM_THREADS=2")
endif()
