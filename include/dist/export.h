/* libdist: symbol export and C/C++ linkage macros shared by every public header. */
#ifndef DIST_EXPORT_H
#define DIST_EXPORT_H

#if defined(_WIN32)
#define DIST_API __declspec(dllexport)
#elif defined(__GNUC__)
#define DIST_API __attribute__((visibility("default")))
#else
#define DIST_API
#endif

#ifdef __cplusplus
#define DIST_BEGIN_DECLS extern "C" {
#define DIST_END_DECLS }
#else
#define DIST_BEGIN_DECLS
#define DIST_END_DECLS
#endif

#endif
