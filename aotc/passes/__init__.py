"""Graph passes, run in order by ``aotc.passes.pipeline``."""
