/* qola_common.h - symbol isolation macros for libraries built by qola (C and C++).
 *
 * qola generates qola_config.h next to this header (OUT/include) with
 *   #define QOLA_NAMESPACE te          (the manifest's [qola].namespace)
 *   #define QOLA_NAMESPACE_STR "te"
 *   #define QOLA_VERSION_STR "0.1.0"
 *
 * C++ API:     QOLA_NS_BEGIN  int get_value();  QOLA_NS_END      -> qola::te::get_value
 *              QOLA_NS(get_value)                                 -> ::qola::te::get_value
 * C API:       QOLA_C_API int QOLA_C_NAME(demo_get_value)(void);  -> extern "C" te_demo_get_value
 *
 * Only qola::<ns>::... and <ns>_... are exported (linker version script, or localisation in
 * static archives); everything else in the library is hidden. One namespace per translation
 * unit: a consumer using two qola outputs includes each from its own source file (or declares
 * the other's C names itself).
 */
#ifndef QOLA_COMMON_H
#define QOLA_COMMON_H

#include "qola_config.h"

#ifndef QOLA_NAMESPACE
#error "qola_config.h must define QOLA_NAMESPACE (qola generates it into OUT/include)"
#endif

#define QOLA_CAT_(a, b) a##b
#define QOLA_CAT(a, b) QOLA_CAT_(a, b)
#define QOLA_STR_(a) #a
#define QOLA_STR(a) QOLA_STR_(a)

/* <ns>_<name>: the C name of an entry point, e.g. QOLA_C_NAME(qola_version) -> te_qola_version */
#define QOLA_C_NAME(name) QOLA_CAT(QOLA_CAT(QOLA_NAMESPACE, _), name)

#if defined(_WIN32)
#define QOLA_VISIBLE
#else
#define QOLA_VISIBLE __attribute__((visibility("default")))
#endif

#ifdef __cplusplus
#define QOLA_EXTERN_C extern "C"
#define QOLA_NS_BEGIN \
    namespace qola {  \
    namespace QOLA_NAMESPACE {
#define QOLA_NS_END \
    }               \
    }
#define QOLA_NS(sym) ::qola::QOLA_NAMESPACE::sym
#else
#define QOLA_EXTERN_C
#endif

/* an exported C entry point: extern "C" (in C++) with default visibility */
#define QOLA_C_API QOLA_EXTERN_C QOLA_VISIBLE

/* The version of the qola output this library belongs to: "<QOLA_VERSION_STR>". */
QOLA_C_API const char* QOLA_C_NAME(qola_version)(void);

/* Define <ns>_qola_version() in one source file of each module. It is weak, so several modules
 * of one output linked into one program (static archives) do not collide. */
#define QOLA_DEFINE_VERSION()                                                   \
    QOLA_C_API __attribute__((weak)) const char* QOLA_C_NAME(qola_version)(void) \
    {                                                                           \
        return QOLA_VERSION_STR;                                                \
    }

#endif /* QOLA_COMMON_H */
