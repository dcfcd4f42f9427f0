# Installing volley and packing it for Debian 12.
#
# `cmake --install` puts the two programs in bin/, their manual pages in
# share/man/man1/, the systemd units in lib/systemd/system/ (their
# ExecStart= naming the installed programs), the example run
# configurations in share/doc/volley/examples/, make-cert.sh in
# share/volley/ and the operator's documents in share/doc/volley/.
# Everything belongs to one of two components, peer and coordinator, which
# CPack's DEB generator turns into the packages volley-peer (volley-peer-cuda
# in a CUDA build, which conflicts with it) and volley-coordinator. Their
# maintainer scripts are deploy/debian/. deploy/package-test.sh builds the
# packages and installs them into a fresh Debian 12 root.
include(GNUInstallDirs)

# What is installed, built alone: `cmake --build B --target volley_dist`
# then `cmake --install B` or `cpack`. Neither builds every test and
# benchmark first (CMAKE_SKIP_INSTALL_ALL_DEPENDENCY).
set(CMAKE_SKIP_INSTALL_ALL_DEPENDENCY ON)

install(TARGETS volley-peer RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT peer)
install(TARGETS volley-coordinator RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
        COMPONENT coordinator)

# Manual pages, gzip'd as Debian ships them (-n: no name or time inside, so
# the same source gives the same bytes).
set(volley_man_dir ${CMAKE_BINARY_DIR}/man)
foreach(prog volley-peer volley-coordinator)
  set(src ${CMAKE_SOURCE_DIR}/deploy/man/${prog}.1)
  add_custom_command(OUTPUT ${volley_man_dir}/${prog}.1.gz
    COMMAND ${CMAKE_COMMAND} -E make_directory ${volley_man_dir}
    COMMAND sh -c "gzip -9 -n -c '${src}' > '${volley_man_dir}/${prog}.1.gz'"
    DEPENDS ${src} COMMENT "Compressing the manual page of ${prog}" VERBATIM)
  list(APPEND volley_man_pages ${volley_man_dir}/${prog}.1.gz)
endforeach()
add_custom_target(volley_man ALL DEPENDS ${volley_man_pages})
add_custom_target(volley_dist DEPENDS volley-peer volley-coordinator volley_man)
install(FILES ${volley_man_dir}/volley-peer.1.gz DESTINATION ${CMAKE_INSTALL_MANDIR}/man1
        COMPONENT peer)
install(FILES ${volley_man_dir}/volley-coordinator.1.gz DESTINATION ${CMAKE_INSTALL_MANDIR}/man1
        COMPONENT coordinator)

# The units in deploy/ name /usr/local, the default prefix, so they can be
# copied by hand from a source tree; the installed ones name this prefix.
# Each package keeps its documents in a folder of its own (dpkg refuses a
# file that two packages ship), which the unit's Documentation= names.
set(VOLLEY_SYSTEMD_UNIT_DIR "lib/systemd/system" CACHE STRING
    "Where the systemd units are installed, relative to the prefix")
function(volley_unit name component docdir)
  file(READ ${CMAKE_SOURCE_DIR}/deploy/${name}.service text)
  string(REPLACE "/usr/local/bin/" "${CMAKE_INSTALL_FULL_BINDIR}/" text "${text}")
  string(REPLACE "file:///usr/local/share/doc/volley/"
                 "file://${CMAKE_INSTALL_FULL_DATAROOTDIR}/doc/${docdir}/" text "${text}")
  file(CONFIGURE OUTPUT ${CMAKE_BINARY_DIR}/systemd/${name}.service CONTENT "${text}")
  install(FILES ${CMAKE_BINARY_DIR}/systemd/${name}.service
          DESTINATION ${VOLLEY_SYSTEMD_UNIT_DIR} COMPONENT ${component})
endfunction()
# file(READ) does not make a change to the templates reconfigure by itself.
set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS
             ${CMAKE_SOURCE_DIR}/deploy/volley-peer.service
             ${CMAKE_SOURCE_DIR}/deploy/volley-coordinator.service)
volley_unit(volley-coordinator coordinator volley)
volley_unit(volley-peer peer volley-peer)

install(FILES docs/operations.md docs/protocol.md docs/security.md README.md
        DESTINATION ${CMAKE_INSTALL_DATAROOTDIR}/doc/volley COMPONENT coordinator)
install(FILES docs/operations.md docs/protocol.md README.md
        DESTINATION ${CMAKE_INSTALL_DATAROOTDIR}/doc/volley-peer COMPONENT peer)
file(GLOB volley_examples ${CMAKE_SOURCE_DIR}/deploy/*.example.json)
install(FILES ${volley_examples} DESTINATION ${CMAKE_INSTALL_DATAROOTDIR}/doc/volley/examples
        COMPONENT coordinator)
install(PROGRAMS deploy/make-cert.sh DESTINATION ${CMAKE_INSTALL_DATAROOTDIR}/volley
        COMPONENT coordinator)

# Debian packages: `cpack -G DEB` in a build folder configured with
# -DCMAKE_INSTALL_PREFIX=/usr. The packages install under the build's own
# prefix, the one the units were written for.
set(CPACK_PACKAGE_NAME volley)
set(CPACK_PACKAGE_VENDOR "volley")
set(CPACK_PACKAGE_CONTACT "volley maintainers <volley@localhost>")
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGING_INSTALL_PREFIX ${CMAKE_INSTALL_PREFIX})
set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_COMPONENTS_ALL peer coordinator)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION net)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
# adduser makes the volley user in postinst (useradd when it is missing).
set(CPACK_DEBIAN_PACKAGE_DEPENDS "adduser")
set(CPACK_DEBIAN_PACKAGE_RELEASE 1)

# The maintainer scripts of a component, from the templates in
# deploy/debian/: DIRS are path:mode:owner triples postinst makes (group
# volley), PURGE_RM the folders a purge deletes, PURGE_RMDIR those it
# deletes when empty, PURGE_TEXT what postrm's header says of them.
function(volley_deb_scripts component package dirs purge_rm purge_rmdir purge_text)
  set(VOLLEY_DEB_PACKAGE ${package})
  set(VOLLEY_DEB_UNIT ${package}.service)
  if(component STREQUAL "peer")
    set(VOLLEY_DEB_UNIT volley-peer.service)
  endif()
  set(VOLLEY_DEB_DIRS "${dirs}")
  set(VOLLEY_DEB_PURGE_RM "${purge_rm}")
  set(VOLLEY_DEB_PURGE_RMDIR "${purge_rmdir}")
  set(VOLLEY_DEB_PURGE_TEXT "${purge_text}")
  set(files)
  foreach(script postinst prerm postrm)
    set(out ${CMAKE_BINARY_DIR}/debian/${component}/${script})
    configure_file(${CMAKE_SOURCE_DIR}/deploy/debian/${script}.in ${out} @ONLY
                   FILE_PERMISSIONS OWNER_READ OWNER_WRITE OWNER_EXECUTE GROUP_READ
                                    GROUP_EXECUTE WORLD_READ WORLD_EXECUTE)
    list(APPEND files ${out})
  endforeach()
  set(volley_deb_${component} ${files} PARENT_SCOPE)
endfunction()

set(CPACK_DEBIAN_COORDINATOR_PACKAGE_NAME volley-coordinator)
string(CONCAT CPACK_DEBIAN_COORDINATOR_DESCRIPTION
    "collaborative model training: the coordinator\n"
    "Keeps one training run in an SQLite database and serves it over HTTPS\n"
    "to volunteer peers: leases tasks, checks their signed updates and merges\n"
    "them into new versions. Includes a systemd unit that starts once a run\n"
    "database and TLS files exist.")
set(CPACK_DEBIAN_COORDINATOR_PACKAGE_RECOMMENDS "openssl")
volley_deb_scripts(coordinator volley-coordinator
  "/var/lib/volley:0700:volley /etc/volley:0755:root /etc/volley/tls:0750:root"
  "" "/etc/volley/tls /etc/volley /var/lib/volley"
  "/var/lib/volley and /etc/volley, when empty (a run database and TLS keys are kept).")
set(CPACK_DEBIAN_COORDINATOR_PACKAGE_CONTROL_EXTRA ${volley_deb_coordinator})
set(CPACK_DEBIAN_COORDINATOR_PACKAGE_CONTROL_STRICT_PERMISSION ON)

string(CONCAT CPACK_DEBIAN_PEER_DESCRIPTION
    "collaborative model training: the volunteer peer\n"
    "Leases training tasks from a volley coordinator over HTTPS, trains the\n"
    "model at a low priority and uploads signed updates. Includes a systemd\n"
    "unit that starts once the peer has joined a run.")
if(VOLLEY_HAVE_CUDA)
  # The CUDA runtime and cuBLAS come from NVIDIA's installer, not from a
  # Debian package dpkg-shlibdeps could name: it is told to look for them
  # where they are (-l) and to leave them out of Depends.
  set(CPACK_DEBIAN_PEER_PACKAGE_NAME volley-peer-cuda)
  set(CPACK_DEBIAN_PEER_PACKAGE_CONFLICTS volley-peer)
  set(CPACK_DEBIAN_PEER_PACKAGE_REPLACES volley-peer)
  set(CPACK_DEBIAN_PEER_PACKAGE_PROVIDES volley-peer)
  set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS_PRIVATE_DIRS ${CUDAToolkit_LIBRARY_DIR})
  string(APPEND CPACK_DEBIAN_PEER_DESCRIPTION
         "\n.\nThis build trains on an NVIDIA GPU too; it needs the NVIDIA driver and\n"
         "the CUDA ${CUDAToolkit_VERSION_MAJOR} runtime with cuBLAS.")
else()
  set(CPACK_DEBIAN_PEER_PACKAGE_NAME volley-peer)
  set(CPACK_DEBIAN_PEER_PACKAGE_CONFLICTS volley-peer-cuda)
endif()
volley_deb_scripts(peer ${CPACK_DEBIAN_PEER_PACKAGE_NAME} "/var/lib/volley-peer:0700:volley"
  "/var/lib/volley-peer" "" "/var/lib/volley-peer, the peer's key and state.")
set(CPACK_DEBIAN_PEER_PACKAGE_CONTROL_EXTRA ${volley_deb_peer})
set(CPACK_DEBIAN_PEER_PACKAGE_CONTROL_STRICT_PERMISSION ON)
include(CPack)

if(NOT VOLLEY_FUZZ AND NOT VOLLEY_SANITIZE AND NOT VOLLEY_TSAN)
  add_subdirectory(tests/package)
endif()
