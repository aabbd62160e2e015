# Installs libdist.pc and the CMake package (libdistConfig.cmake, its version file and the
# exported targets libdist::dist and libdist::dist_static).
#
# Included from src/CMakeLists.txt after the dist and dist_static targets exist; reads
# DIST_LINK_LIBS (what libdist links) and DIST_HAVE_CUDA from there. Neither names a CUDA library:
# those are linked by libdist_cuda.so only, which libdist dlopen()s. Both generated files are
# derived from DIST_LINK_LIBS, so a new dependency added there reaches consumers of the static
# library without an edit here (a new pkg-config module only needs a line in the table below to
# appear in Requires.private instead of Libs.private).

include(CMakePackageConfigHelpers)

set(DIST_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/libdist CACHE STRING
    "Where libdistConfig.cmake is installed, relative to the prefix")
set(DIST_INSTALL_PKGCONFIGDIR ${CMAKE_INSTALL_LIBDIR}/pkgconfig CACHE STRING
    "Where libdist.pc is installed, relative to the prefix")

# Link items of an imported target, flattened to file paths, names and flags (recursively), so
# that a consumer can recreate the target where its own find module is unavailable.
function(dist_flatten_link_item item out_var)
  set(result)
  if(TARGET ${item})
    get_target_property(type ${item} TYPE)
    if(NOT type STREQUAL "INTERFACE_LIBRARY")
      foreach(prop IMPORTED_LOCATION IMPORTED_LOCATION_RELEASE IMPORTED_LOCATION_NOCONFIG
                   IMPORTED_LOCATION_RELWITHDEBINFO IMPORTED_LOCATION_DEBUG)
        get_target_property(loc ${item} ${prop})
        if(loc)
          list(APPEND result ${loc})
          break()
        endif()
      endforeach()
    endif()
    get_target_property(deps ${item} INTERFACE_LINK_LIBRARIES)
    if(deps)
      foreach(d IN LISTS deps)
        if(d MATCHES "^\\$<LINK_ONLY:(.*)>$")
          set(d ${CMAKE_MATCH_1})
        endif()
        if(d MATCHES "\\$<")
          continue() # a generator expression (a compile-language condition): not a library
        endif()
        dist_flatten_link_item(${d} sub)
        list(APPEND result ${sub})
      endforeach()
    endif()
  elseif(NOT item STREQUAL "")
    list(APPEND result ${item})
  endif()
  list(REMOVE_DUPLICATES result)
  set(${out_var} ${result} PARENT_SCOPE)
endfunction()

# ---- CMake package --------------------------------------------------------------------------
# For each imported target in libdist's link interface: which find_package() makes it the
# idiomatic way, and the files it stood for here (used when that find_package fails).
set(DIST_CONFIG_DEPENDENCIES "")
foreach(item IN LISTS DIST_LINK_LIBS)
  if(NOT TARGET ${item})
    continue()
  endif()
  get_target_property(imported ${item} IMPORTED)
  if(NOT imported)
    continue()
  endif()
  set(package "")
  if(item MATCHES "^Threads::")
    set(package "Threads")
  elseif(item MATCHES "^ZLIB::")
    set(package "ZLIB")
  elseif(item MATCHES "^CURL::")
    set(package "CURL")
  elseif(item MATCHES "^OpenMP::")
    set(package "OpenMP COMPONENTS C")
  endif()
  dist_flatten_link_item(${item} files)
  string(APPEND DIST_CONFIG_DEPENDENCIES
         "_libdist_dependency(${item} \"${package}\" \"${files}\")\n")
endforeach()

install(EXPORT libdistTargets NAMESPACE libdist:: FILE libdistTargets.cmake
        DESTINATION ${DIST_INSTALL_CMAKEDIR})
configure_package_config_file(${PROJECT_SOURCE_DIR}/tools/cmake/libdistConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/libdistConfig.cmake
                              INSTALL_DESTINATION ${DIST_INSTALL_CMAKEDIR})
# 0.x: a minor release may break the API, so only the same minor version is compatible.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/libdistConfigVersion.cmake
                                 VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/libdistConfig.cmake
              ${PROJECT_BINARY_DIR}/libdistConfigVersion.cmake
        DESTINATION ${DIST_INSTALL_CMAKEDIR})

# ---- pkg-config -----------------------------------------------------------------------------
# Imported targets that have a .pc file of their own go to Requires.private.
set(dist_pc_modules "PkgConfig::CJSON=libcjson" "PkgConfig::TURBOJPEG=libturbojpeg" "PkgConfig::PNG=libpng"
    "ZLIB::ZLIB=zlib" "CURL::libcurl=libcurl" "PkgConfig::LIBSSL=libssl" "PkgConfig::LIBCRYPTO=libcrypto"
    "PkgConfig::HDF5=hdf5" "PkgConfig::LIBZIP=libzip")

# "-L<dir> -l<name>" for a library file; flags and bare names as the linker wants them.
function(dist_pc_link_flags items out_var)
  set(flags)
  foreach(f IN LISTS items)
    if(f MATCHES "^-")
      list(APPEND flags ${f})
    elseif(IS_ABSOLUTE "${f}" AND f MATCHES "/lib([^/]+)\\.(so|a)(\\.[0-9.]+)?$")
      set(name ${CMAKE_MATCH_1})
      get_filename_component(dir ${f} DIRECTORY)
      if(NOT dir IN_LIST CMAKE_C_IMPLICIT_LINK_DIRECTORIES)
        list(APPEND flags "-L${dir}")
      endif()
      list(APPEND flags "-l${name}")
    elseif(IS_ABSOLUTE "${f}")
      list(APPEND flags ${f})
    else()
      list(APPEND flags "-l${f}")
    endif()
  endforeach()
  set(${out_var} ${flags} PARENT_SCOPE)
endfunction()

set(pc_requires)
set(pc_libs)
foreach(item IN LISTS DIST_LINK_LIBS)
  set(module "")
  foreach(pair IN LISTS dist_pc_modules)
    if(pair MATCHES "^(.*)=(.*)$" AND item STREQUAL CMAKE_MATCH_1)
      set(module ${CMAKE_MATCH_2})
    endif()
  endforeach()
  if(module AND PKG_CONFIG_EXECUTABLE)
    execute_process(COMMAND ${PKG_CONFIG_EXECUTABLE} --exists ${module} RESULT_VARIABLE rc)
    if(rc EQUAL 0)
      list(APPEND pc_requires ${module})
      continue()
    endif()
  endif()
  if(item MATCHES "^OpenMP::")
    # -fopenmp is a compile flag; a consumer links libgomp (and libpthread) by name.
    set(files ${OpenMP_C_LIB_NAMES})
  elseif(item MATCHES "^Threads::")
    set(files pthread)
  else()
    dist_flatten_link_item(${item} files)
  endif()
  dist_pc_link_flags("${files}" flags)
  list(APPEND pc_libs ${flags})
endforeach()
# Keep the last occurrence of each -l (link order), the first of each -L.
list(REVERSE pc_libs)
list(REMOVE_DUPLICATES pc_libs)
list(REVERSE pc_libs)
set(pc_dirs ${pc_libs})
list(FILTER pc_dirs INCLUDE REGEX "^-L")
list(FILTER pc_libs EXCLUDE REGEX "^-L")
list(REMOVE_DUPLICATES pc_dirs)
list(JOIN pc_requires ", " DIST_PC_REQUIRES_PRIVATE)
string(JOIN " " DIST_PC_LIBS_PRIVATE ${pc_dirs} ${pc_libs})

# The prefix is found relative to the .pc file, so the install prefix may be chosen at install
# time (cmake --install --prefix) or the tree moved.
if(IS_ABSOLUTE "${DIST_INSTALL_PKGCONFIGDIR}")
  set(DIST_PC_PREFIX "${CMAKE_INSTALL_PREFIX}")
  set(DIST_PC_PKGCONFIGDIR "${DIST_INSTALL_PKGCONFIGDIR}")
else()
  file(RELATIVE_PATH rel /prefix/${DIST_INSTALL_PKGCONFIGDIR} /prefix)
  string(REGEX REPLACE "/$" "" rel "${rel}")
  set(DIST_PC_PREFIX "\${pcfiledir}/${rel}")
endif()
foreach(kind LIBDIR INCLUDEDIR)
  if(IS_ABSOLUTE "${CMAKE_INSTALL_${kind}}")
    set(DIST_PC_${kind} "${CMAKE_INSTALL_${kind}}")
  else()
    set(DIST_PC_${kind} "\${prefix}/${CMAKE_INSTALL_${kind}}")
  endif()
endforeach()
configure_file(${PROJECT_SOURCE_DIR}/tools/cmake/libdist.pc.in ${PROJECT_BINARY_DIR}/libdist.pc
               @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/libdist.pc DESTINATION ${DIST_INSTALL_PKGCONFIGDIR})
