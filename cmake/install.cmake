# `cmake --install`: the headers, the libraries, the `deltaproof` command line and a CMake package, so that
# `find_package(deltaproof)` gives deltaproof::reference (header-only), deltaproof::verify and, in a build
# with CUDA, deltaproof::cuda.
include(CMakePackageConfigHelpers)
set(DELTAPROOF_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/deltaproof)

set_target_properties(deltaproof_reference PROPERTIES EXPORT_NAME reference)
set_target_properties(deltaproof_verify PROPERTIES EXPORT_NAME verify)
set(DELTAPROOF_INSTALLED_TARGETS deltaproof_reference deltaproof_verify)
install(DIRECTORY reference/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/deltaproof/reference
        FILES_MATCHING PATTERN "*.hpp")
install(DIRECTORY verify/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/deltaproof/verify
        FILES_MATCHING PATTERN "*.hpp" PATTERN tests EXCLUDE)
if(DELTAPROOF_WITH_CUDA)
  set_target_properties(deltaproof_cuda PROPERTIES EXPORT_NAME cuda)
  list(APPEND DELTAPROOF_INSTALLED_TARGETS deltaproof_cuda)
  # The host API only: the kernels' sources (.cuh) and the test seams (testing/) stay in the tree.
  install(DIRECTORY cuda/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/deltaproof/cuda
          FILES_MATCHING PATTERN "*.h" PATTERN "*.hpp" PATTERN testing EXCLUDE)
  if(TARGET deltaproof_cuda_nccl)
    set_target_properties(deltaproof_cuda_nccl PROPERTIES EXPORT_NAME cuda_nccl)
    list(APPEND DELTAPROOF_INSTALLED_TARGETS deltaproof_cuda_nccl)
  endif()
endif()

install(TARGETS ${DELTAPROOF_INSTALLED_TARGETS} EXPORT deltaproofTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(TARGETS deltaproof RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(EXPORT deltaproofTargets NAMESPACE deltaproof:: DESTINATION ${DELTAPROOF_INSTALL_CMAKEDIR})

set(DELTAPROOF_CONFIG_WITH_CUDA ${DELTAPROOF_WITH_CUDA})
configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/deltaproofConfig.cmake.in
  ${PROJECT_BINARY_DIR}/deltaproofConfig.cmake INSTALL_DESTINATION ${DELTAPROOF_INSTALL_CMAKEDIR})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/deltaproofConfigVersion.cmake COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/deltaproofConfig.cmake ${PROJECT_BINARY_DIR}/deltaproofConfigVersion.cmake
        DESTINATION ${DELTAPROOF_INSTALL_CMAKEDIR})

# A downstream project built against an installed prefix (tests/downstream/): install into a folder of the
# build tree, configure, build and run it.
if(DELTAPROOF_BUILD_TESTS)
  add_test(NAME cmake_package_downstream
           COMMAND ${CMAKE_COMMAND} -DBUILD_DIR=${PROJECT_BINARY_DIR} -DSOURCE_DIR=${PROJECT_SOURCE_DIR}/cmake/downstream
                   -DWORK_DIR=${PROJECT_BINARY_DIR}/downstream -DGENERATOR=${CMAKE_GENERATOR}
                   -DWITH_CUDA=${DELTAPROOF_WITH_CUDA} -P ${PROJECT_SOURCE_DIR}/cmake/downstream_test.cmake)
  set_tests_properties(cmake_package_downstream PROPERTIES LABELS "cli;install" TIMEOUT 600)
endif()
