# The installed static library defines no global symbol outside the API (src/CMakeLists.txt
# localizes the internal ones); the in-tree dist_internal keeps them, which the check sees.
add_test(NAME unit.static_library_exports_only_the_api
         COMMAND ${CMAKE_COMMAND} -DNM=${CMAKE_NM} -DLIB=$<TARGET_FILE:dist_static>
                 -P ${CMAKE_CURRENT_SOURCE_DIR}/cli/static_symbols.cmake)
set_tests_properties(unit.static_library_exports_only_the_api PROPERTIES LABELS unit)
add_test(NAME unit.static_symbols_check_sees_internal_names
         COMMAND ${CMAKE_COMMAND} -DNM=${CMAKE_NM} -DLIB=$<TARGET_FILE:dist_internal>
                 -P ${CMAKE_CURRENT_SOURCE_DIR}/cli/static_symbols.cmake)
set_tests_properties(unit.static_symbols_check_sees_internal_names
                     PROPERTIES LABELS unit WILL_FAIL TRUE)
# The shared library exports the API alone too (hidden visibility, DIST_API on the API): what a
# program linking libdist.so can bind to, and what could interpose on another library's names.
add_test(NAME unit.shared_library_exports_only_the_api
         COMMAND ${CMAKE_COMMAND} -DNM=${CMAKE_NM} -DDYNAMIC=1 -DLIB=$<TARGET_FILE:dist>
                 -P ${CMAKE_CURRENT_SOURCE_DIR}/cli/static_symbols.cmake)
set_tests_properties(unit.shared_library_exports_only_the_api PROPERTIES LABELS unit)
