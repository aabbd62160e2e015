# The PJRT client (src/pjrt): unit.pjrt needs only the fake plugins below; pjrt.cpu_plugin and
# pjrt.libtpu run against real plugins that the pjrt.venv fixture installs from PyPI, pinned
# with their hashes in tests/pjrt/requirements.lock, into a cached venv outside the tree.

# Fake plugins for the loader's error paths: one source, built once per flaw
# (name:DEFINE,DEFINE).
set(pjrt_fakes
    "noapi:FAKE_NO_GET_API"
    "major1:FAKE_MAJOR=1,FAKE_MINOR=60"
    "old:FAKE_MINOR=40"
    "short:FAKE_ENTRIES=30"
    "newer:FAKE_MINOR=200")
foreach(f ${pjrt_fakes})
  string(REPLACE ":" ";" parts "${f}")
  string(REPLACE "," ";" parts "${parts}")
  list(GET parts 0 name)
  list(SUBLIST parts 1 -1 defs)
  add_library(pjrt_fake_${name} MODULE ${CMAKE_CURRENT_SOURCE_DIR}/pjrt/fake_plugin.c)
  target_include_directories(pjrt_fake_${name} PRIVATE ${PROJECT_SOURCE_DIR}/src)
  target_compile_definitions(pjrt_fake_${name} PRIVATE ${defs})
  target_compile_options(pjrt_fake_${name} PRIVATE ${DIST_WARNINGS})
  add_dependencies(test_pjrt pjrt_fake_${name})
  string(TOUPPER ${name} upper)
  target_compile_definitions(test_pjrt PRIVATE FAKE_${upper}="$<TARGET_FILE:pjrt_fake_${name}>")
endforeach()
target_link_libraries(test_pjrt PRIVATE ${CMAKE_DL_LIBS})

# The real plugins' venv: ${DIST_PJRT_VENV} (env DIST_PJRT_VENV, default
# ~/.cache/libdist/venv-pjrt). tests/pjrt/venv.sh links each plugin into its plugins/ folder.
if(DEFINED ENV{DIST_PJRT_VENV})
  set(DIST_PJRT_VENV $ENV{DIST_PJRT_VENV})
else()
  set(DIST_PJRT_VENV $ENV{HOME}/.cache/libdist/venv-pjrt)
endif()
set(DIST_TEST_PJRT_PLUGIN ${DIST_PJRT_VENV}/plugins/pjrt_c_api_cpu_plugin.so)
set(DIST_TEST_LIBTPU ${DIST_PJRT_VENV}/plugins/libtpu.so)

add_test(NAME pjrt.venv COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/pjrt/venv.sh)
set_tests_properties(pjrt.venv PROPERTIES FIXTURES_SETUP pjrt_venv LABELS "pjrt" TIMEOUT 900
                     ENVIRONMENT "DIST_PJRT_VENV=${DIST_PJRT_VENV}")

# Without the fixture these fail (test_pjrt.c checks that the plugin file is there): a venv that
# could not be built must not read as a pass. Labelled integration too, so that .ci/run's
# sanitizer stage runs them: what they check is our handling of the plugin's objects (LSan sees
# a buffer, event or error we forget to destroy), unlike the conformance tests' Python.
add_test(NAME pjrt.cpu_plugin COMMAND test_pjrt cpu_plugin)
set_tests_properties(pjrt.cpu_plugin PROPERTIES FIXTURES_REQUIRED pjrt_venv LABELS "pjrt;integration"
                     TIMEOUT 600 ENVIRONMENT "${unit_env};DIST_TEST_PJRT_PLUGIN=${DIST_TEST_PJRT_PLUGIN}")
add_test(NAME pjrt.libtpu COMMAND test_pjrt libtpu)
set_tests_properties(pjrt.libtpu PROPERTIES FIXTURES_REQUIRED pjrt_venv LABELS "pjrt;integration"
                     TIMEOUT 600 ENVIRONMENT "${unit_env};DIST_TEST_LIBTPU=${DIST_TEST_LIBTPU}")
