/* The sum of a vector's eight floats, for the AVX2 copy of a kernel header (included inside its
   #pragma GCC target region; NAME(x) names this copy's functions). */
static inline float NAME(hsum8)(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
