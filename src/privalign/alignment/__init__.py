"""privalign.alignment"""
