# The dashboard's counting, the per-peer totals it reads and the writer's
# histograms (the page itself: tests/integration/dashboard.sh).
volley_unit_test(test_dashboard volley_coord_ops)
