# Copies what the generated pages need of a MathJax 2 installation (Debian's
# libjs-mathjax) into the HTML folder, so that formulas render offline and the
# folder still works when copied to another machine.
# Usage: cmake -DSRC=<MathJax 2 folder> -DDST=<html>/mathjax -P copy_mathjax.cmake
#
# The pages use TeX input and HTML-CSS output with the TeX fonts only (see
# mathjax-config.js), so this copies MathJax.js, the extensions (tex2jax, menus,
# TeX macros loaded on demand), the TeX input, the MathML element jax, the
# HTML-CSS output with its TeX font metrics, and the TeX web fonts (woff, with
# otf for browsers without woff): about 1.7 MB of the package's 54 MB.
# Symbolic links (Debian keeps some files in other packages) are followed.
if(NOT DEFINED SRC OR NOT DEFINED DST)
  message(FATAL_ERROR "usage: cmake -DSRC=mathjax-dir -DDST=html/mathjax -P copy_mathjax.cmake")
endif()
if(NOT EXISTS "${SRC}/MathJax.js")
  message(FATAL_ERROR "docs: ${SRC}/MathJax.js is missing; reinstall libjs-mathjax and reconfigure")
endif()

set(single_files
    MathJax.js
    jax/output/HTML-CSS/config.js
    jax/output/HTML-CSS/jax.js
    jax/output/HTML-CSS/imageFonts.js)
set(whole_folders
    extensions
    jax/input/TeX
    jax/element
    jax/output/HTML-CSS/autoload
    jax/output/HTML-CSS/fonts/TeX
    fonts/HTML-CSS/TeX/woff
    fonts/HTML-CSS/TeX/otf)
set(files ${single_files})
foreach(folder IN LISTS whole_folders)
  file(GLOB_RECURSE found LIST_DIRECTORIES false FOLLOW_SYMLINKS RELATIVE "${SRC}" "${SRC}/${folder}/*")
  list(APPEND files ${found})
endforeach()
list(REMOVE_DUPLICATES files)

set(bytes 0)
set(count 0)
foreach(file IN LISTS files)
  if(NOT EXISTS "${SRC}/${file}")
    continue()  # checked below where it matters
  endif()
  get_filename_component(folder "${DST}/${file}" DIRECTORY)
  file(MAKE_DIRECTORY "${folder}")
  file(COPY_FILE "${SRC}/${file}" "${DST}/${file}" ONLY_IF_DIFFERENT)
  file(SIZE "${DST}/${file}" size)
  math(EXPR bytes "${bytes} + ${size}")
  math(EXPR count "${count} + 1")
endforeach()
foreach(needed MathJax.js jax/input/TeX/jax.js jax/output/HTML-CSS/jax.js extensions/tex2jax.js)
  if(NOT EXISTS "${DST}/${needed}")
    message(FATAL_ERROR "docs: ${SRC} has no ${needed}; is it MathJax 2 (libjs-mathjax)?")
  endif()
endforeach()
math(EXPR kib "${bytes} / 1024")
message(STATUS "docs: MathJax copied into ${DST} (${count} files, ${kib} KiB)")
