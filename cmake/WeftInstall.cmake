# `cmake --install`: libweft, its one public header (with the status codes it returns), weftrun, and a
# package config so that a program finds it with find_package(weft) and links weft::weft.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)
install(TARGETS weft EXPORT weftTargets LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(FILES ${CMAKE_SOURCE_DIR}/runtime/weft.h DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/weft)
install(FILES ${CMAKE_SOURCE_DIR}/base/status.h DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/weft/base)
install(EXPORT weftTargets NAMESPACE weft:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/weft)
file(WRITE ${CMAKE_BINARY_DIR}/weftConfig.cmake
     "# weft's package config: the imported target weft::weft (include <weft/weft.h>).\n"
     "include(\"\${CMAKE_CURRENT_LIST_DIR}/weftTargets.cmake\")\n")
install(FILES ${CMAKE_BINARY_DIR}/weftConfig.cmake DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/weft)
if(TARGET weftrun)
  install(TARGETS weftrun RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
endif()
