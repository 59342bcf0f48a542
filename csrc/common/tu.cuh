// What would be each file's anonymous namespace is `inline namespace TERNARY_TU`, which every
// .cu defines (as <file>_cu) before it includes anything. cudafe++ names an anonymous
// namespace after a hash of the file's path, which put the checkout path into every kernel
// symbol of the fatbin (docs/build.md, Reproducibility); a namespace named after the file keeps
// each file's internals apart as an anonymous one does, and path-free. Inline, so the names
// read as before.
#pragma once

#ifndef TERNARY_TU
#error "define TERNARY_TU (this .cu file's own namespace, e.g. route_cu) before its includes"
#endif
