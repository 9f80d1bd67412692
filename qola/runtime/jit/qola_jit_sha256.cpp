// qola_jit_sha256.cpp — SHA-256 (FIPS 180-4) for keys, compiler identities and entry checks.
// Portable C++ plus an x86 SHA-NI path picked at run time (~5x faster: verifying a multi-MB
// cache entry before dlopen stays well under a millisecond).
#include <cerrno>
#include <cstring>
#include <unistd.h>

#include <string>

#if (defined(__x86_64__) || defined(__i386__)) && !defined(QOLA_JIT_NO_SHA_NI)
#include <cpuid.h>
#include <immintrin.h>
#define QOLA_JIT_SHA_NI 1
#endif

#pragma GCC visibility push(hidden)
#include "qola_jit_internal.h"

QOLA_NS_BEGIN
namespace jit {
namespace sys {
namespace {
alignas(16) const uint32_t K[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

inline uint32_t rotr(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

void blocks_portable(uint32_t* h_, const unsigned char* p, size_t n)
{
    for(; n; --n, p += 64) {
        uint32_t w[64];
        for(int i = 0; i < 16; ++i)
            w[i] = uint32_t(p[4 * i]) << 24 | uint32_t(p[4 * i + 1]) << 16 | uint32_t(p[4 * i + 2]) << 8 | p[4 * i + 3];
        for(int i = 16; i < 64; ++i) {
            uint32_t s0 = rotr(w[i - 15], 7) ^ rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
            uint32_t s1 = rotr(w[i - 2], 17) ^ rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);
            w[i] = w[i - 16] + s0 + w[i - 7] + s1;
        }
        uint32_t a = h_[0], b = h_[1], c = h_[2], d = h_[3], e = h_[4], f = h_[5], g = h_[6], h = h_[7];
        for(int i = 0; i < 64; ++i) {
            uint32_t t1 = h + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) + ((e & f) ^ (~e & g)) + K[i] + w[i];
            uint32_t t2 = (rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
            h = g; g = f; f = e; e = d + t1; d = c; c = b; b = a; a = t1 + t2;
        }
        h_[0] += a; h_[1] += b; h_[2] += c; h_[3] += d; h_[4] += e; h_[5] += f; h_[6] += g; h_[7] += h;
    }
}

#ifdef QOLA_JIT_SHA_NI
__attribute__((target("sha,sse4.1,ssse3"))) void blocks_ni(uint32_t* state, const unsigned char* p, size_t n)
{
    const __m128i mask = _mm_set_epi64x(0x0c0d0e0f08090a0bULL, 0x0405060700010203ULL);
    __m128i tmp = _mm_loadu_si128(reinterpret_cast<const __m128i*>(state));
    __m128i s1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(state + 4));
    tmp = _mm_shuffle_epi32(tmp, 0xB1); // CDAB
    s1 = _mm_shuffle_epi32(s1, 0x1B); // EFGH
    __m128i s0 = _mm_alignr_epi8(tmp, s1, 8); // ABEF
    s1 = _mm_blend_epi16(s1, tmp, 0xF0); // CDGH
    for(; n; --n, p += 64) {
        const __m128i abef = s0, cdgh = s1;
        __m128i m[4];
#pragma GCC unroll 16
        for(int g = 0; g < 16; ++g) {
            if(g < 4)
                m[g] = _mm_shuffle_epi8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16 * g)), mask);
            else // W[4g..4g+3] from the four previous groups (m[g&3] still holds group g-4)
                m[g & 3] = _mm_sha256msg2_epu32(
                    _mm_add_epi32(_mm_sha256msg1_epu32(m[g & 3], m[(g + 1) & 3]),
                                  _mm_alignr_epi8(m[(g + 3) & 3], m[(g + 2) & 3], 4)),
                    m[(g + 3) & 3]);
            __m128i msg = _mm_add_epi32(m[g & 3], _mm_load_si128(reinterpret_cast<const __m128i*>(K + 4 * g)));
            s1 = _mm_sha256rnds2_epu32(s1, s0, msg);
            s0 = _mm_sha256rnds2_epu32(s0, s1, _mm_shuffle_epi32(msg, 0x0E));
        }
        s0 = _mm_add_epi32(s0, abef);
        s1 = _mm_add_epi32(s1, cdgh);
    }
    tmp = _mm_shuffle_epi32(s0, 0x1B); // FEBA
    s1 = _mm_shuffle_epi32(s1, 0xB1); // DCHG
    s0 = _mm_blend_epi16(tmp, s1, 0xF0); // DCBA
    s1 = _mm_alignr_epi8(s1, tmp, 8); // ABEF
    _mm_storeu_si128(reinterpret_cast<__m128i*>(state), s0);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(state + 4), s1);
}

bool have_sha_ni()
{
    unsigned a, b, c, d;
    if(!__get_cpuid(1, &a, &b, &c, &d) || !(c & bit_SSE4_1) || !(c & bit_SSSE3)) return false;
    return __get_cpuid_count(7, 0, &a, &b, &c, &d) && (b & (1u << 29)); // CPUID.7.0:EBX.SHA
}
#endif

void blocks(uint32_t* h, const unsigned char* p, size_t n)
{
#ifdef QOLA_JIT_SHA_NI
    static const bool ni = have_sha_ni();
    if(ni) return blocks_ni(h, p, n);
#endif
    blocks_portable(h, p, n);
}
} // namespace

Sha256::Sha256() : h_{0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19},
                   buf_{}, len_(0), fill_(0) {}

void Sha256::update(const void* data, size_t n)
{
    const unsigned char* p = static_cast<const unsigned char*>(data);
    len_ += n;
    if(fill_) {
        size_t take = 64 - fill_ < n ? 64 - fill_ : n;
        memcpy(buf_ + fill_, p, take);
        fill_ += take; p += take; n -= take;
        if(fill_ < 64) return;
        blocks(h_, buf_, 1);
        fill_ = 0;
    }
    blocks(h_, p, n / 64);
    p += n / 64 * 64;
    n %= 64;
    memcpy(buf_, p, n);
    fill_ = n;
}

std::string Sha256::hex()
{
    uint64_t bits = len_ * 8;
    unsigned char pad[72] = {0x80};
    size_t padlen = fill_ < 56 ? 56 - fill_ : 120 - fill_;
    for(int i = 0; i < 8; ++i) pad[padlen + i] = (unsigned char)(bits >> (56 - 8 * i));
    update(pad, padlen + 8);
    static const char* digits = "0123456789abcdef";
    std::string out(64, '0');
    for(int i = 0; i < 32; ++i) {
        unsigned char byte = (unsigned char)(h_[i / 4] >> (24 - 8 * (i % 4)));
        out[2 * i] = digits[byte >> 4];
        out[2 * i + 1] = digits[byte & 15];
    }
    return out;
}

std::string sha256_hex(const std::string& data)
{
    Sha256 s;
    s.update(data.data(), data.size());
    return s.hex();
}

bool sha256_fd(int fd, std::string* hex, uint64_t* size)
{
    Sha256 s;
    uint64_t total = 0;
    static thread_local char buf[1 << 16];
    for(off_t off = 0;;) {
        ssize_t n = pread(fd, buf, sizeof buf, off);
        if(n < 0 && errno == EINTR) continue;
        if(n < 0) return false;
        if(n == 0) break;
        s.update(buf, size_t(n));
        off += n;
        total += uint64_t(n);
    }
    *hex = s.hex();
    *size = total;
    return true;
}

} // namespace sys
} // namespace jit
QOLA_NS_END
#pragma GCC visibility pop
