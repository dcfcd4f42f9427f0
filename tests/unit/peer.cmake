volley_unit_test(test_peer volley_peer)
volley_unit_test(test_peer_resume volley_peer)
volley_unit_test(test_peer_tokens volley_peer)
volley_unit_test(test_peer_refuse volley_peer)
volley_unit_test(test_peer_kfac volley_peer)
volley_unit_test(test_peer_device volley_peer)
# What a peer has done (peer/progress.h) and `volley-peer status`.
volley_unit_test(test_peer_progress volley_peer)
# What a volunteer sees of a run (peer/ui.h): the status line, JSON lines.
volley_unit_test(test_peer_ui volley_peer)
# One process at a time in a peer's directory (peer/dirlock.h).
volley_unit_test(test_peer_dirlock volley_peer)
# The peer as a guest on a shared machine (peer/guest.h): priority, passive
# waits (the test re-executes itself as volley-peer does), thread count.
volley_unit_test(test_peer_guest volley_peer)
# A peer's task and compression on a GPU against the host; without a device
# it reports itself skipped (exit 77).
if(VOLLEY_HAVE_CUDA)
  volley_unit_test(test_peer_gpu volley_peer)
  volley_unit_test(test_peer_nopeek_gpu volley_peer)
endif()
# NoPeek's term in a split step (peer/nopeek.h) on the CPU.
volley_unit_test(test_peer_nopeek volley_peer)
# Classification on the peer's own images (peer/local.h): --partition,
# shares, local tasks, MLP model files and training.
volley_unit_test(test_peer_local volley_peer)
