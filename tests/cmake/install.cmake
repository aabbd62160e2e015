# Install and packaging tests (label "install"):
#   install.headers   every include/dist/*.h compiles alone as C11 and as C++17
#   install.consumers cmake --install into a temporary prefix, then C and C++ programs built
#                     against it with pkg-config and with find_package(libdist CONFIG), and run
set(dist_install_env "CC=${CMAKE_C_COMPILER}" "CXX=${CMAKE_CXX_COMPILER}" "CMAKE=${CMAKE_COMMAND}")
set(dist_install_sanitize "")
if(DIST_SANITIZE)
  set(dist_install_sanitize "-fsanitize=address,undefined")
endif()

add_test(NAME install.headers
         COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/install/headers.sh ${PROJECT_SOURCE_DIR}/include)
add_test(NAME install.consumers
         COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/install/run.sh ${PROJECT_BINARY_DIR}
                 "${dist_install_sanitize}")
set_tests_properties(install.headers install.consumers PROPERTIES
                     LABELS install TIMEOUT 600 ENVIRONMENT "${dist_install_env}")
