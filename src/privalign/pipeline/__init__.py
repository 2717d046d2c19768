"""privalign.pipeline"""
