# Turns the dashboard page (IN) into a C file (OUT) that defines
# coord_dashboard_html and coord_dashboard_html_len (coordinator/ops/dashboard.h),
# so the page ships inside the binary. Run by the build with
#   cmake -DIN=index.html -DOUT=dashboard_page.c -P embed.cmake
# Bytes are written as hex, so nothing in the page needs escaping.
if(NOT IN OR NOT OUT)
  message(FATAL_ERROR "embed.cmake needs -DIN=<page> -DOUT=<c file>")
endif()
file(READ "${IN}" hex HEX)
string(LENGTH "${hex}" digits)
math(EXPR len "${digits} / 2")
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," bytes "${hex}")
# Sixteen bytes a line rather than one line of the whole page.
string(REPEAT "0x[0-9a-f][0-9a-f]," 16 line)
string(REGEX REPLACE "(${line})" "\\1\n    " bytes "${bytes}")
file(WRITE "${OUT}"
  "/* Generated from coordinator/ops/dashboard/index.html by embed.cmake. */\n"
  "#include \"coordinator/ops/dashboard.h\"\n\n"
  "const unsigned char coord_dashboard_html[] = {\n    ${bytes}0x00};\n"
  "const size_t coord_dashboard_html_len = ${len};\n")
